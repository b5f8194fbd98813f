"""Training-step speed of an nn.TransformerEncoder language model against a matmul floor.

    python benchmarks/transformer_step.py [--steps 20] [--threads 1]

PyTorch's word-language-model TransformerModel, scaled: Embedding(V, 256) *
sqrt(256) + a fixed sinusoidal position table -> TransformerEncoder(2 x
TransformerEncoderLayer(256, 4 heads, 1024, dropout 0.1)) with the causal
mask -> Linear(256, V), V = 1000, sequence 64, batch 16 (sequence-first, the
example's layout), float32, cross-entropy, SGD. In a fresh process per BLAS
thread count it times, interleaved:
  floor  the matrix products of the same forward and backward: every
         Linear's forward, weight gradient and input gradient as 2-D GEMMs
         over the T*N rows (in_proj, out_proj, linear1, linear2, decoder) and
         the batched attention products q kᵀ, a v and their four gradients
  ours   the spmdnet step: model(src, mask), F.cross_entropy, backward, opt.step()
  xp     ours with SPMDNET_KERNELS=xp (no Numba kernels)
and prints median times and the ratios to the floor.
"""
import math

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn, optim
from spmdnet.launch import thread_sweep

from lm_timing import (  # benchmarks/ is on the path of a script run
    FLOOR_OURS_XP_COLUMNS,
    attention_floor,
    time_floor_ours_xp,
)

V, E, HEADS, FF, LAYERS, T, N = 1000, 256, 4, 1024, 2, 64, 16


def position_table():
    position = np.arange(T)[:, None]
    div = np.exp(np.arange(0, E, 2) * (-math.log(10000.0) / E))
    table = np.zeros((T, 1, E), np.float32)
    table[:, 0, 0::2], table[:, 0, 1::2] = np.sin(position * div), np.cos(position * div)
    return table


class TransformerModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("pe", position_table())
        self.encoder = nn.Embedding(V, E)
        layer = nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.1)
        self.transformer_encoder = nn.TransformerEncoder(layer, LAYERS)
        self.decoder = nn.Linear(E, V)

    def forward(self, src, mask):
        x = self.encoder(src) * math.sqrt(E) + self.pe
        return self.decoder(self.transformer_encoder(x, mask))


def floor_fn(rng):
    return attention_floor(rng, N, T, E, HEADS, FF, LAYERS, V)


def build_ours(tokens, targets, kernels="numba"):
    sn.manual_seed(0)
    model = TransformerModel()
    opt = optim.SGD(model.parameters(), lr=0.1)
    mask = nn.Transformer.generate_square_subsequent_mask(T)
    src, y = sn.tensor(tokens), sn.tensor(targets)

    def step():
        with sn.kernels.use(kernels):
            loss = F.cross_entropy(model(src, mask).view(-1, V), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return step


def child(steps):
    time_floor_ours_xp(steps, V, (T, N), floor_fn, build_ours)


def header(steps):
    return (f"TransformerEncoder LM V={V} d={E} heads={HEADS} ff={FF} layers={LAYERS} "
            f"T={T} N={N}, float32, SGD; median of {steps} interleaved steps (ms)\n"
            + FLOOR_OURS_XP_COLUMNS)


def main():
    return thread_sweep(__file__, __doc__, child, header, threads=(1,), steps=20)


if __name__ == "__main__":
    main()
