"""Tensor-parallel transformer layers (Megatron-LM): attention heads and the
vocabulary split over the TP group.

``ParallelSelfAttention``: rank t owns heads ``[t*H/tp, (t+1)*H/tp)``: its
rows of the q, k and v projections (column-parallel by whole heads), its
heads' attention, and the matching columns of the output projection
(row-parallel); one allreduce forward (g) and one backward (f)::

    x ─f─> [q_t k_t v_t] = x W_t.T ─> attention(heads t) ─> RowParallel ─g─> + b

``VocabParallelEmbedding``: rank t owns vocabulary rows ``[t*V/tp, (t+1)*V/tp)``,
looks up the tokens it owns, zeroes the others' rows, allreduce.
``vocab_parallel_cross_entropy``: the loss of vocabulary-split logits
(a ``ColumnParallelLinear`` head) without gathering them.

Each layer draws its full parameters as its serial counterpart does
(``nn.MultiheadAttention``, ``nn.Embedding``) and keeps its slice, so a TP
model equals the serial one seeded alike; ``gather_state_dict`` /
``scatter_state_dict`` join and split ``in_proj_weight`` by heads
(``tp_split_groups=3``), so checkpoints load into the serial model and back.
"""
import numpy as np

from ... import distributed as dist
from ... import functional as F
from ..._tensor import Tensor
from ...autograd import Function
from ...backend import xp_of
from ...nn import Embedding, MultiheadAttention, Parameter
from ...nn.modules.activation import _additive
from .layers import (RowParallelLinear, TPModule, _ParallelLinear, _shard, check_comm,
                              split_shard, tp_rng_region)
from .collectives import check_replicated, copy_to_group, reduce_from_group


class _OutProjection(RowParallelLinear):
    """The row-parallel output projection, sliced from given full arrays
    (no init of its own: the serial module's draws are the only ones)."""

    def __init__(self, weight, bias, comm):
        _ParallelLinear.__init__(self, weight.shape[1], weight.shape[0], comm)
        self.input_is_parallel = True
        self.weight = _shard(weight, 1, comm, "ParallelSelfAttention", "embed_dim")
        self.bias = None if bias is None else Parameter(bias)


class ParallelSelfAttention(TPModule):
    """Self-attention of batch-first (B, T, E) input with the heads split over
    ``comm``; the serial counterpart is ``nn.MultiheadAttention(embed_dim,
    num_heads, bias=bias, batch_first=True)`` called as ``mha(x, x, x)``,
    with the same parameter names. ``attn_mask`` as MultiheadAttention's
    (True or -inf = masked out, float added), (T, T) or broadcasting to
    (B, 1, T, T); ``is_causal`` alone masks the future. Dropout on the
    attention weights draws per-TP-rank streams (each rank's own heads)."""

    def __init__(self, embed_dim, num_heads, comm, dropout=0.0, bias=True, dtype=None):
        super().__init__()
        comm = check_comm(comm, "ParallelSelfAttention")
        self.comm, self.tp_size = comm, comm.Get_size()
        if num_heads % self.tp_size:
            raise ValueError(f"ParallelSelfAttention: num_heads {num_heads} is not divisible "
                             f"by the tensor-parallel size {self.tp_size}")
        full = MultiheadAttention(embed_dim, num_heads, bias=bias, dtype=dtype)
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.local_heads, self.head_dim = num_heads // self.tp_size, full.head_dim
        self.in_proj_weight = _shard(full.in_proj_weight.array, 0, comm, "ParallelSelfAttention",
                                     "embed_dim", groups=3)
        self.in_proj_bias = None if not bias else _shard(
            full.in_proj_bias.array, 0, comm, "ParallelSelfAttention", "embed_dim", groups=3)
        self.out_proj = _OutProjection(full.out_proj.weight.array,
                                       None if not bias else full.out_proj.bias.array, comm)

    def load_serial(self, source):
        """Copy this rank's shard of a serial ``nn.MultiheadAttention`` (or of
        its state_dict) into this layer."""
        state = source.state_dict() if hasattr(source, "state_dict") else source
        tp, t = self.tp_size, self.comm.Get_rank()
        local = {}
        for key, p in self._state_items():
            full = np.asarray(state[key].array if isinstance(state[key], Tensor) else state[key])
            axis = getattr(p, "tp_split_axis", None)
            local[key] = full if axis is None else split_shard(full, axis, tp, t,
                                                               p.tp_split_groups)
        self.load_state_dict(local)

    def forward(self, x, attn_mask=None, is_causal=False):
        if x.ndim != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"ParallelSelfAttention: expected input (B, T, {self.embed_dim}), "
                             f"got {tuple(x.shape)}")
        b, length, _ = x.shape
        qkv = F.linear(copy_to_group(x, self.comm), self.in_proj_weight, self.in_proj_bias)
        q, k, v = (t.reshape(b, length, self.local_heads, self.head_dim).transpose(1, 2)
                   for t in qkv.chunk(3, dim=-1))
        p = self.dropout if self.training else 0.0
        mask = None if attn_mask is None else _additive(attn_mask, q)
        with tp_rng_region(self.comm):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                 is_causal=bool(is_causal) and mask is None)
        out = out.transpose(1, 2).reshape(b, length, self.local_heads * self.head_dim)
        return self.out_proj(out)

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"local_heads={self.local_heads}, dropout={self.dropout}, tp={self.tp_size}")


class VocabParallelEmbedding(TPModule):
    """``nn.Embedding(num_embeddings, embedding_dim)`` with the rows split
    over ``comm``: rank t owns a contiguous vocabulary slice, zeroes the rows
    of tokens outside it, and one allreduce sums the ranks' lookups."""

    def __init__(self, num_embeddings, embedding_dim, comm, dtype=None):
        super().__init__()
        comm = check_comm(comm, "VocabParallelEmbedding")
        self.comm, self.tp_size = comm, comm.Get_size()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        full = Embedding(num_embeddings, embedding_dim, dtype=dtype).weight.array
        self.weight = _shard(full, 0, comm, "VocabParallelEmbedding", "num_embeddings")
        self.vocab_start = comm.Get_rank() * (num_embeddings // self.tp_size)

    def forward(self, input):  # noqa: A002 - PyTorch's name
        idx = input.array if isinstance(input, Tensor) else xp_of(self.weight.array).asarray(input)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.num_embeddings):
            raise IndexError(f"VocabParallelEmbedding: index out of range "
                             f"[0, {self.num_embeddings}): min {int(idx.min())}, "
                             f"max {int(idx.max())}")
        check_replicated(idx, self.comm, "the token ids of VocabParallelEmbedding")
        local = idx - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        rows = F.embedding(Tensor(xp_of(idx).where(outside, 0, local)), self.weight)
        keep = Tensor((~outside)[..., None].astype(self.weight.dtype))
        return reduce_from_group(rows * keep, self.comm)

    def extra_repr(self):
        return (f"{self.num_embeddings}, {self.embedding_dim}, tp={self.tp_size}, "
                f"vocab_start={self.vocab_start}")


class VocabParallelCrossEntropy(Function):
    """Mean cross-entropy of vocabulary-split logits (..., V/tp); rank t holds
    classes ``[t*V/tp, (t+1)*V/tp)``. Three allreduces of one number per
    row (max, sum of exps, target logit); backward needs none."""

    def forward(self, logits, target=None, comm=None, ignore_index=-100):
        xp = xp_of(logits)
        width = logits.shape[-1]
        local = target - comm.Get_rank() * width
        mine = (local >= 0) & (local < width)
        local = xp.where(mine, local, 0)
        row_max = dist.allreduce(logits.max(axis=-1), op="max", comm=comm)
        e = xp.exp(logits - row_max[..., None])
        total = dist.allreduce(e.sum(axis=-1), op="sum", comm=comm)
        picked = xp.take_along_axis(logits, local[..., None], axis=-1)[..., 0]
        target_logit = dist.allreduce(xp.where(mine, picked, 0.0), op="sum", comm=comm)
        valid = target != ignore_index
        count = int(valid.sum())
        losses = xp.where(valid, xp.log(total) + row_max - target_logit, 0.0)
        self.saved = (e / total[..., None], local, mine & valid, valid, count)
        return xp.asarray(losses.sum() / count if count else xp.nan, dtype=logits.dtype)

    def backward(self, g):
        soft, local, hit, valid, count = self.saved
        xp = xp_of(soft)
        grad = soft * valid[..., None]
        onehot = (xp.arange(soft.shape[-1]) == local[..., None]) & hit[..., None]
        grad = grad - onehot
        return grad * (g / max(count, 1))


def vocab_parallel_cross_entropy(logits_shard, target, comm, ignore_index=-100):
    """``F.cross_entropy(gathered_logits, target, ignore_index=...)`` (mean over
    the targets not ignored) from this rank's vocabulary slice of the logits
    (N, V/tp) or (..., V/tp), without gathering them."""
    comm = check_comm(comm, "vocab_parallel_cross_entropy")
    xp = xp_of(logits_shard.array)
    tgt = xp.asarray(target.array if isinstance(target, Tensor) else target)
    if tgt.dtype.kind not in "iu" or tgt.shape != tuple(logits_shard.shape[:-1]):
        raise ValueError(f"vocab_parallel_cross_entropy: target must be integers of shape "
                         f"{tuple(logits_shard.shape[:-1])}, got {tgt.dtype} {tgt.shape}")
    check_replicated(tgt, comm, "the targets of vocab_parallel_cross_entropy")
    vocab = logits_shard.shape[-1] * comm.Get_size()
    counted = tgt[tgt != ignore_index]
    if counted.size and (int(counted.min()) < 0 or int(counted.max()) >= vocab):
        # every rank of the group holds the same targets: all raise, none waits
        bad = counted[(counted < 0) | (counted >= vocab)]
        raise IndexError(f"vocab_parallel_cross_entropy: target {int(bad[0])} is out of "
                         f"bounds [0, {vocab}) ({logits_shard.shape[-1]} classes on each of "
                         f"{comm.Get_size()} tensor-parallel ranks)")
    return VocabParallelCrossEntropy.apply(logits_shard, target=tgt, comm=comm,
                                           ignore_index=ignore_index)
