"""Training-step speed of a minGPT-style transformer against a matmul floor.

    python benchmarks/gpt_step.py [--steps 30] [--threads 1]

GPT with d=128, 4 heads, block 64, batch 16, 2 layers, vocabulary 65, AdamW,
float32, written as minGPT is written for PyTorch: one c_attn Linear, q/k/v by
split/view/transpose(1, 2), ``q @ k.transpose(-2, -1)`` scaled, masked_fill
with a registered tril buffer, softmax(dim=-1), ``@ v``, heads joined with
transpose/contiguous/view, an MLP of c_fc -> GELU -> c_proj, pre-LayerNorm
residual blocks, cross_entropy on ``logits.view(-1, V)``. In a fresh process
per BLAS thread count it times, interleaved:
  floor  the matrix products of the same forward and backward: every Linear's
         forward, weight gradient and input gradient (c_attn, c_proj, c_fc,
         mlp c_proj, lm_head) as 2-D GEMMs over the B*T rows, the batched
         attention products q k^T and a v and their four gradient products
  floor_bt  the same with each Linear's forward and input-gradient product
         on (B, T, C) operands, as the code states them (NumPy's stacked
         matmul: about 1.3x slower)
  ours   the minGPT code above: model(idx, targets), backward, opt.step()
  sdpa   the same model with F.scaled_dot_product_attention(is_causal=True)
         in place of the four attention lines
  xp     ours with SPMDNET_KERNELS=xp (no Numba kernels)
and prints median times and the ratios to the floor (issue 16's goal: ours
<= 1.4; PyTorch's CPU step measures about 1.65x this floor).
"""
import math
import os

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn, optim
from spmdnet.launch import thread_sweep

from lm_timing import attention_floor  # benchmarks/ is on the path of a script run
from mlp_step import median_times

B, T, D, H, L, V = 16, 64, 128, 4, 2, 65


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, sdpa=False):
        super().__init__()
        self.n_head, self.n_embd, self.sdpa = n_head, n_embd, sdpa
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.0), nn.Dropout(0.0)
        self.register_buffer("bias", sn.tril(sn.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, sdpa=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, sdpa)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(n_embd, 4 * n_embd),
                                      c_proj=nn.Linear(4 * n_embd, n_embd),
                                      act=nn.GELU(), dropout=nn.Dropout(0.0)))

    def mlpf(self, x):
        m = self.mlp
        return m.dropout(m.c_proj(m.act(m.c_fc(x))))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlpf(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, sdpa=False):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, D), wpe=nn.Embedding(T, D), drop=nn.Dropout(0.0),
            h=nn.ModuleList([Block(D, H, T, sdpa) for _ in range(L)]),
            ln_f=nn.LayerNorm(D)))
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, idx, targets):
        b, t = idx.size()
        pos = sn.arange(0, t, dtype=sn.long).unsqueeze(0)
        tr = self.transformer
        x = tr.drop(tr.wte(idx) + tr.wpe(pos))
        for block in tr.h:
            x = block(x)
        logits = self.lm_head(tr.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)
        return logits, loss


def floor_fn(rng, stacked=False):
    """The forward and backward matrix products alone, on random arrays:
    each Linear as 2-D GEMMs over all B*T rows, or with ``stacked`` on
    (B, T, C) operands as the model's code states them (NumPy then loops
    over B, as a naive port would; weight gradients stay 2-D)."""
    return attention_floor(rng, B, T, D, H, 4 * D, L, V, stacked)


def ours_fn(idx, targets, kernels="numba", sdpa=False):
    sn.manual_seed(0)
    model = GPT(sdpa)
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    idx, targets = sn.tensor(idx), sn.tensor(targets)

    def step():
        with sn.kernels.use(kernels):
            _, loss = model(idx, targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return step


def child(steps):
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))
    fns = {"floor": floor_fn(rng), "floor_bt": floor_fn(rng, stacked=True),
           "ours": ours_fn(idx, targets),
           "sdpa": ours_fn(idx, targets, sdpa=True), "xp": ours_fn(idx, targets, "xp")}
    for fn in fns.values():
        fn()  # warm-up: compiles the kernels
    t = median_times(fns, steps)
    print(f"{os.environ['OMP_NUM_THREADS']:>7} {t['floor'] * 1e3:9.2f} "
          f"{t['floor_bt'] * 1e3:9.2f} {t['ours'] * 1e3:9.2f} {t['sdpa'] * 1e3:9.2f} "
          f"{t['xp'] * 1e3:9.2f} {t['ours'] / t['floor']:10.2f} {t['sdpa'] / t['floor']:10.2f} "
          f"{t['xp'] / t['floor']:8.2f} {t['ours'] / t['floor_bt']:13.2f}", flush=True)


def header(steps):
    return (f"minGPT, d={D}, {H} heads, T={T}, batch {B}, {L} layers, vocabulary {V}, "
            f"float32, AdamW; median of {steps} interleaved steps (ms); goal ours/floor "
            "<= 1.4\nthreads  floor_ms  floor_bt   ours_ms   sdpa_ms     xp_ms ours/floor "
            "sdpa/floor xp/floor ours/floor_bt")


def main():
    return thread_sweep(__file__, __doc__, child, header)


if __name__ == "__main__":
    main()
