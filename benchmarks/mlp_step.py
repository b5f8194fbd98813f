"""Training-step speed and memory of spmdnet against a plain-NumPy floor.

    python benchmarks/mlp_step.py [--steps 30] [--threads 1 2]

MLP 784-1024-1024-10, batch 256, float32, SGD with momentum, cross-entropy.
For each BLAS thread count it starts a fresh process (BLAS reads its thread
count at import) that times, interleaved in one run:
  floor  the same forward and backward matrix products written by hand
  numpy  a complete hand-written NumPy step (products + relu + softmax
         cross-entropy + SGD momentum), no autograd
  ours   a spmdnet step: model(x), F.cross_entropy, backward, opt.step()
  xp     the same spmdnet step with SPMDNET_KERNELS=xp (no Numba kernels)
and prints median times, the ratios to the floor (goal for ours <= 1.15,
issue 6; without kernels <= 1.35) and the peak memory a step allocates
(tracemalloc), ours/floor (goal <= 1.5). Kernel compilation happens in a
warm-up step before timing; its seconds are printed at the end of the row.
"""
import os
import time
import tracemalloc

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import optim
from spmdnet.bench.step_bench import LAYERS, build_model
from spmdnet.kernels import compile_seconds
from spmdnet.launch import thread_sweep

BATCH = 256


def make_problem():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, LAYERS[0])).astype(np.float32)
    y = rng.integers(0, LAYERS[-1], BATCH)
    weights = [(rng.uniform(-1, 1, (o, i)) / np.sqrt(i)).astype(np.float32)
               for i, o in zip(LAYERS[:-1], LAYERS[1:])]
    return x, y, weights


def floor_step(x, weights):
    """Only the matrix products of forward and backward (no input gradient)."""
    acts = [x]
    for w in weights:
        acts.append(acts[-1] @ w.T)
    g = acts[-1]
    for i in range(len(weights) - 1, -1, -1):
        _gw = g.T @ acts[i]
        if i:
            g = g @ weights[i]


def numpy_step(x, y, params, bufs, lr=0.01, mom=0.9):
    """A complete hand-written step: what a careful NumPy programmer writes."""
    ws, bs = params[0::2], params[1::2]
    acts = [x]
    for j, (w, b) in enumerate(zip(ws, bs)):
        h = acts[-1] @ w.T
        h += b
        if j < len(ws) - 1:
            np.maximum(h, 0, out=h)
        acts.append(h)
    logits = acts[-1]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    g = p / len(y)
    grads = [None] * len(params)
    for j in range(len(ws) - 1, -1, -1):
        grads[2 * j] = g.T @ acts[j]
        grads[2 * j + 1] = g.sum(axis=0)
        if j:
            g = (g @ ws[j]) * (acts[j] > 0)
    for prm, grad, buf in zip(params, grads, bufs):
        buf *= mom
        buf += grad
        prm -= lr * buf


def build_ours(x, y, kernels="numba", model=None):
    """One SGD-momentum step of ``model`` (default: the MLP of ``build_model``) on (x, y)."""
    model = build_model() if model is None else model
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xt = sn.Tensor(x)

    def step():
        with sn.kernels.use(kernels):  # "numba" or "xp", for this step only
            loss = F.cross_entropy(model(xt), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return step


def median_times(fns, steps):
    times = {name: [] for name in fns}
    for _ in range(steps):
        for name, fn in fns.items():  # interleaved: the machine's noise hits all alike
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def peak_bytes(fn):
    fn()  # warm: persistent state (momentum buffers) is not a step's allocation
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


def child(steps):
    x, y, weights = make_problem()
    params = [a for w in weights for a in (w.copy(), np.zeros(w.shape[0], np.float32))]
    bufs = [np.zeros_like(p) for p in params]
    fns = {"floor": lambda: floor_step(x, weights),
           "numpy": lambda: numpy_step(x, y, params, bufs),
           "ours": build_ours(x, y), "xp": build_ours(x, y, "xp")}
    for fn in fns.values():
        fn()  # warm-up: compiles the kernels this step uses
    compiled = compile_seconds()
    t = median_times(fns, steps)
    mem = {name: peak_bytes(fn) for name, fn in fns.items()}
    threads = os.environ["OMP_NUM_THREADS"]
    print(f"{threads:>7} {t['floor'] * 1e3:9.2f} {t['numpy'] * 1e3:9.2f} "
          f"{t['ours'] * 1e3:9.2f} {t['xp'] * 1e3:9.2f} {t['numpy'] / t['floor']:11.3f} "
          f"{t['ours'] / t['floor']:10.3f} {t['xp'] / t['floor']:8.3f} "
          f"{mem['floor'] / 2**20:9.1f} {mem['ours'] / 2**20:8.1f} "
          f"{mem['ours'] / mem['floor']:8.2f} {compiled:9.1f}", flush=True)


def header(steps):
    return (f"MLP {'-'.join(map(str, LAYERS))}, batch {BATCH}, float32, SGD momentum; median "
            f"of {steps} interleaved steps (ms); peak step allocation (MiB)\n"
            "threads floor_ms  numpy_ms   ours_ms     xp_ms numpy/floor ours/floor xp/floor "
            "floor_MiB ours_MiB mem_ratio compile_s")


def main():
    return thread_sweep(__file__, __doc__, child, header, threads=(1, 2))


if __name__ == "__main__":
    main()
