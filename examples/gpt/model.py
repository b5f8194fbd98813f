"""The GPT of the trainers beside this file, written as minGPT writes it for PyTorch.

Token and position embeddings, Blocks of LayerNorm -> causal self-attention
(one qkv Linear, heads split with view/transpose,
F.scaled_dot_product_attention) and LayerNorm -> MLP with GELU, each with a
residual connection, a final LayerNorm and an (untied) Linear head. With
``tp`` (a communicator) the attention heads (parallel.ParallelSelfAttention),
the MLP (column -> row parallel), the token embedding
(VocabParallelEmbedding) and the head (column parallel) are split over it;
with ``blocks``/``first``/``last`` a GPT is one pipeline stage. Every trainer
builds the serial model of its seed first (``serial_gpt``) and loads its part
of it (``load_part``), so all of them train the same model.
"""
import math
import re

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn, parallel
from spmdnet.parallel.tensor_parallel import split_shard


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        if n_embd % n_head:
            raise SystemExit(f"--n-embd {n_embd} is not a multiple of --n-head {n_head}")
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)  # q, k, v of every head at once
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_drop(self.c_proj(y))


class TPSelfAttention(nn.Module):
    """CausalSelfAttention with the heads split over ``tp`` (its c_attn is
    ``attn.in_proj_weight``/``in_proj_bias``, its c_proj ``attn.out_proj``)."""

    def __init__(self, n_embd, n_head, dropout, tp):
        super().__init__()
        if n_head % tp.Get_size():
            raise SystemExit(f"--n-head {n_head} is not a multiple of --tp {tp.Get_size()}")
        self.attn = parallel.ParallelSelfAttention(n_embd, n_head, tp, dropout=dropout)
        self.resid_drop = nn.Dropout(dropout)  # outside the TP region: the same mask

    def forward(self, x):
        return self.resid_drop(self.attn(x, is_causal=True))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout, tp=None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        if tp is None:
            self.attn = CausalSelfAttention(n_embd, n_head, dropout)
            self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                     nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout))
        else:  # Megatron: column -> row parallel, one allreduce each way
            self.attn = TPSelfAttention(n_embd, n_head, dropout, tp)
            self.mlp = nn.Sequential(parallel.ColumnParallelLinear(n_embd, 4 * n_embd, tp),
                                     nn.GELU(), parallel.RowParallelLinear(4 * n_embd, n_embd, tp),
                                     nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """The GPT, or a part of it: ``blocks`` (default all ``n_layer``), with the
    embeddings when ``first`` and the final LayerNorm and head when ``last``
    (a pipeline stage); tensor parallel over ``tp`` when given. Returns the
    logits (the vocabulary slice of this TP rank) when ``last``, else the
    activations."""

    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0, tp=None,
                 blocks=None, first=True, last=True):
        super().__init__()
        self.block_size, self.tp, self.first, self.last = block_size, tp, first, last
        if first:
            self.wte = nn.Embedding(vocab_size, n_embd) if tp is None else \
                parallel.VocabParallelEmbedding(vocab_size, n_embd, tp)
            self.wpe = nn.Embedding(block_size, n_embd)
            self.drop = nn.Dropout(dropout)
        n = n_layer if blocks is None else blocks
        self.h = nn.ModuleList([Block(n_embd, n_head, dropout, tp) for _ in range(n)])
        if last:
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False) if tp is None else \
                parallel.ColumnParallelLinear(n_embd, vocab_size, tp, bias=False)

    def init_weights(self, n_layer):  # GPT-2's initialisation (of the serial model)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, x):
        if self.first:
            x = self.drop(self.wte(x) + self.wpe(sn.arange(x.shape[1])))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x  # (B, T, vocab) logits


SERIAL_NAMES = [(r"attn\.attn\.in_proj_(weight|bias)$", r"attn.c_attn.\1"),
                (r"attn\.attn\.out_proj\.", "attn.c_proj.")]


def load_part(part, serial_state, mesh, first_block):
    """Load this rank's part (blocks from ``first_block``, TP slices) of the
    serial model's state into ``part``."""
    local = {}
    for key, p in part.named_parameters():
        name = re.sub(r"^h\.(\d+)\.", lambda m: f"h.{int(m[1]) + first_block}.", key)
        for pattern, repl in SERIAL_NAMES:
            name = re.sub(pattern, repl, name)
        full = serial_state[name]
        axis = getattr(p, "tp_split_axis", None)
        local[key] = full if axis is None else split_shard(
            full, axis, mesh.tp_size, mesh.tp_rank, getattr(p, "tp_split_groups", 1))
    part.load_state_dict(local)


def decay_options(weight_decay):
    """AdamW's options for a parameter: decay on matrices, none on biases and LayerNorm."""
    return lambda name, p: {"weight_decay": weight_decay if p.ndim >= 2 else 0.0}


def padded_vocab(vocab_size, tp):
    multiple = 8 * tp // math.gcd(8, tp)
    return -(-vocab_size // multiple) * multiple


def serial_gpt(vocab_size, args, tp_size=1):
    """The whole model of ``args.seed`` with GPT-2's initialisation; the same
    on every rank and in every trainer (the vocabulary padded alike)."""
    sn.manual_seed(args.seed)
    model = GPT(padded_vocab(vocab_size, tp_size), args.block_size, args.n_layer, args.n_head,
                args.n_embd, args.dropout)
    model.init_weights(args.n_layer)
    return model


def param_groups(params, weight_decay):
    """AdamW's groups: weight decay on the matrices (Linear weights,
    embeddings) only, never on biases and LayerNorm weights."""
    params = list(params)
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def cross_entropy(logits, y, tp=None, reduction="mean"):
    """The loss of (B, T, vocab) logits against (B, T) targets; with ``tp``
    the logits are this rank's vocabulary slice, never gathered."""
    logits = logits.reshape(-1, logits.shape[-1])
    y = np.asarray(y.array if isinstance(y, sn.Tensor) else y).reshape(-1)
    if tp is None:
        return F.cross_entropy(logits, y, reduction=reduction)
    loss = parallel.vocab_parallel_cross_entropy(logits, y, tp)
    return loss * y.size if reduction == "sum" else loss
