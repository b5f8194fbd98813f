"""Training-step speed of an LSTM language model, and of nn.LSTM alone, against
a matmul floor.

    python benchmarks/lstm_step.py [--steps 20] [--threads 1]

PyTorch's word-language-model example at its small setting: Embedding(V, 200)
-> LSTM(200, 200, num_layers=2) -> Linear(200, V), V = 10000, bptt 35,
batch 20, float32, cross-entropy, SGD (the example's own update); then the
LSTM alone (forward, sum of the output, backward to the input and weights).
In a fresh process per BLAS thread count it times, interleaved:
  floor  the matrix products of the same forward and backward: per layer the
         input projection over all steps (forward, weight and input
         gradients), the T recurrent (N, H) x (H, 4H) products forward and T
         backward, the recurrent weight gradient as one product; the LM's
         decoder's three products
  ours   the spmdnet step: model(x, hidden), F.cross_entropy, backward,
         opt.step() (the LSTM alone: forward and backward)
  xp     ours with SPMDNET_KERNELS=xp (no Numba kernels: the LSTM's steps in
         NumPy calls, ops/rnn.py, instead of kernels/rnn_cell.py's float32
         kernels, which also run each recurrent product in column blocks
         small enough for OpenBLAS's small-matrix kernels: ours can undercut
         the floor's whole products)
and prints median times and the ratios to the floor.
"""
import os

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn, optim
from spmdnet.launch import thread_sweep

from lm_timing import (  # benchmarks/ is on the path of a script run
    FLOOR_OURS_XP_COLUMNS,
    time_floor_ours_xp,
)
from mlp_step import median_times

V, E, H, LAYERS, T, N = 10000, 200, 200, 2, 35, 20


class LanguageModel(nn.Module):
    """The example's RNNModel: encoder, LSTM, decoder (dropout 0: timing only)."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(V, E)
        self.rnn = nn.LSTM(E, H, LAYERS)
        self.decoder = nn.Linear(H, V)

    def forward(self, tokens, hidden):
        output, hidden = self.rnn(self.encoder(tokens), hidden)
        return self.decoder(output).view(-1, V), hidden


def lstm_floor(x, w_ih, w_t, w_hh, h):
    """The LSTM's products alone: x[layer] (T, N, I) inputs, w_t the
    contiguous W_hhᵀ copies the op multiplies by."""
    rows = T * N
    for layer in range(LAYERS):
        xw = x[layer].reshape(rows, -1) @ w_ih[layer].T
        for _ in range(T):
            _ = h @ w_t[layer]
        _ = xw.T @ x[layer].reshape(rows, -1)  # weight gradient
        _ = xw @ w_ih[layer]  # input gradient
        for _ in range(T):
            _ = xw[:N] @ w_hh[layer]
        _ = xw.T @ x[layer + 1].reshape(rows, H)  # recurrent weight gradient


def floor_step(arrays):
    """Only the matrix products of forward and backward."""
    x, w_ih, w_hh, dec, h = arrays
    lstm_floor(x, w_ih, [np.ascontiguousarray(w.T) for w in w_hh], w_hh, h)
    rows = T * N
    logits = x[-1].reshape(rows, H) @ dec.T
    _ = logits.T @ x[-1].reshape(rows, H)
    _ = logits @ dec


def floor_arrays(rng):
    f32 = np.float32
    x = [rng.standard_normal((T, N, E if i == 0 else H)).astype(f32) for i in range(LAYERS)]
    x.append(rng.standard_normal((T, N, H)).astype(f32))
    w_ih = [rng.standard_normal((4 * H, E if i == 0 else H)).astype(f32) for i in range(LAYERS)]
    w_hh = [rng.standard_normal((4 * H, H)).astype(f32) for _ in range(LAYERS)]
    return x, w_ih, w_hh, rng.standard_normal((V, H)).astype(f32), \
        rng.standard_normal((N, H)).astype(f32)


def build_ours(tokens, targets, kernels="numba"):
    sn.manual_seed(0)
    model = LanguageModel()
    opt = optim.SGD(model.parameters(), lr=0.1)
    zeros = sn.zeros(LAYERS, N, H)
    x, y = sn.tensor(tokens), sn.tensor(targets)

    def step():
        with sn.kernels.use(kernels):
            logits, _ = model(x, (zeros, zeros))
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return step


def floor_fn(rng):
    arrays = floor_arrays(rng)
    return lambda: floor_step(arrays)


def time_lstm_alone(steps):
    """nn.LSTM(E, H, LAYERS) forward + backward against lstm_floor, one row."""
    rng = np.random.default_rng(1)
    x, w_ih, w_hh, _, h = floor_arrays(rng)
    w_t = [np.ascontiguousarray(w.T) for w in w_hh]
    sn.manual_seed(0)
    lstm = nn.LSTM(E, H, LAYERS)
    inputs = sn.tensor(x[0], requires_grad=True)

    def ours(kernels="numba"):
        def step():
            with sn.kernels.use(kernels):
                out, _ = lstm(inputs)
                out.sum().backward()
            inputs.grad = None
            for p in lstm.parameters():
                p.grad = None
        return step

    fns = {"floor": lambda: lstm_floor(x, w_ih, w_t, w_hh, h), "ours": ours(), "xp": ours("xp")}
    for fn in fns.values():
        fn()
    t = median_times(fns, steps)
    print(f"nn.LSTM({E}, {H}, {LAYERS}) alone, forward + backward\n{FLOOR_OURS_XP_COLUMNS}")
    print(f"{os.environ['OMP_NUM_THREADS']:>7} {t['floor'] * 1e3:9.2f} {t['ours'] * 1e3:9.2f} "
          f"{t['xp'] * 1e3:9.2f} {t['ours'] / t['floor']:10.3f} {t['xp'] / t['floor']:8.3f}",
          flush=True)


def child(steps):
    time_floor_ours_xp(steps, V, (T, N), floor_fn, build_ours)
    time_lstm_alone(steps)


def header(steps):
    return (f"LSTM LM V={V} E={E} H={H} layers={LAYERS} bptt={T} batch={N}, float32, SGD; "
            f"median of {steps} interleaved steps (ms)\n" + FLOOR_OURS_XP_COLUMNS)


def main():
    return thread_sweep(__file__, __doc__, child, header, threads=(1,), steps=20)


if __name__ == "__main__":
    main()
