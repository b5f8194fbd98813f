"""Causal attention, forward + backward: the xp composition (matmul, mask,
softmax, matmul: what F.scaled_dot_product_attention was) against the one
op on its row-blocked path, with plain xp softmax rows and with the
compiled softmax kernels (``SPMDNET_KERNELS=numba``, the default).

    OMP_NUM_THREADS=1 python benchmarks/attention.py [--repeat 5] [--lengths 64 256 1024]

float32, batch 4, 4 heads, head size 32 (d = 128). Prints the median
milliseconds of forward + backward, the peak memory of that (tracemalloc:
NumPy reports its allocations) and the memory forward leaves saved for
backward, for each side.
"""
import argparse
import time
import tracemalloc

import numpy as np

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import kernels
from spmdnet.ops import Softmax


def composition(q, k, v):
    """The old composition of ops (T x T scores, mask and weights kept)."""
    length = q.shape[-2]
    scores = q.matmul(k.transpose(-2, -1)) * (1.0 / np.sqrt(q.shape[-1]))
    mask = np.where(np.tril(np.ones((length, length), bool)), 0.0, -np.inf).astype(q.dtype)
    weights = Softmax.apply(scores + sn.tensor(mask), axis=scores.ndim - 1)
    return weights.matmul(v)


def fused(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def measure(fn, mode, arrays, repeat):
    """(median ms of forward + backward, peak MiB, MiB saved after forward)."""
    def step():
        t = [sn.tensor(a, requires_grad=True) for a in arrays]
        with kernels.use(mode):
            out = fn(*t)
        saved = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
        out.backward(sn.tensor(np.ones(out.shape, np.float32)))
        return saved

    step()  # compile, warm caches
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    saved = step() - base
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return 1e3 * float(np.median(times)), peak / 2**20, saved / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    sides = [("composition", composition, "xp"), ("op, xp blocks", fused, "xp"),
             ("op, numba", fused, "numba")]
    print(f"{'T':>5} {'side':<15} {'ms fwd+bwd':>10} {'peak MiB':>9} {'saved MiB':>9}")
    for length in args.lengths:
        arrays = [rng.standard_normal((4, 4, length, 32)).astype(np.float32)
                  for _ in range(3)]
        for name, fn, mode in sides:
            ms, peak, saved = measure(fn, mode, arrays, args.repeat)
            print(f"{length:>5} {name:<15} {ms:>10.2f} {peak:>9.1f} {saved:>9.1f}")


if __name__ == "__main__":
    main()
