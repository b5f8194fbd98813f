"""FullyShardedDataParallel against DataParallel: bytes per rank and step time.

    mpiexec -n 2 python benchmarks/fsdp.py [--units 8] [--width 512] [--batch 64] [--steps 5]

The model: ``--units`` residual units LayerNorm → Linear(w→4w) → GELU →
Linear(4w→w) (w=512, 8 units: about 17 M parameters), float32, AdamW, batch
``--batch`` per rank. Per rank, for each strategy:
- persistent: parameters + gradients + optimizer state held between steps
  (for FSDP the flat shards, their gradients and AdamW's moments);
- peak: the most bytes NumPy held during a step above what it held before
  (tracemalloc: gathered parameters, flat gradients, activations);
- step: the median step time; for FSDP also the seconds spent in blocking
  all-gathers and reduce-scatters, and how many gathers were prefetched.
Variants: "fsdp" (units recomputed in backward, prefetch), "fsdp-noprefetch",
"fsdp-keep" (``reshard_after_forward=False``: full parameters kept from
forward to the end of backward, no recomputation).
Goals (issue 17): persistent(FSDP) <= persistent(DP) / N + 5%; step time at 2
ranks <= 1.5x DataParallel's.
"""
import argparse
import time
import tracemalloc

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel


class Unit(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def build(strategy, args):
    sn.manual_seed(0)
    model = nn.Sequential(*[Unit(args.width) for _ in range(args.units)])
    if strategy == "dp":
        wrapped = parallel.DataParallel(model)
        params = list(model.parameters())
    else:
        wrapped = parallel.FullyShardedDataParallel(
            model, wrap={Unit}, prefetch=strategy != "fsdp-noprefetch",
            reshard_after_forward=strategy != "fsdp-keep")
        params = list(wrapped.parameters())
    return wrapped, params, optim.AdamW(params, lr=1e-4)


def persistent_bytes(params, opt):
    state = sum(v.nbytes for s in opt.state.values() for k, v in s.items()
                if hasattr(v, "nbytes") and not k.startswith("_"))
    grads = sum(p.grad.data.nbytes for p in params if p.grad is not None)
    return sum(p.data.nbytes for p in params) + grads + state


class CommTimer:
    """Seconds spent inside dist.allgather / dist.reduce_scatter (blocking time)."""

    def __init__(self):
        self.seconds = 0.0
        self.saved = {name: getattr(dist, name) for name in ("allgather", "reduce_scatter")}
        for name, fn in self.saved.items():
            setattr(dist, name, self._timed(fn))

    def _timed(self, fn):
        def call(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
        return call

    def close(self):
        for name, fn in self.saved.items():
            setattr(dist, name, fn)


def run(strategy, args):
    wrapped, params, opt = build(strategy, args)
    rng = np.random.default_rng(dist.rank())
    x = sn.tensor(rng.standard_normal((args.batch, args.width)).astype(np.float32))
    times, peak = [], 0
    timer = CommTimer()
    for _ in range(args.steps + 1):
        dist.barrier()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        opt.zero_grad()
        (wrapped(x) ** 2).mean().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if times[1:]:  # the first step also allocates the optimizer state
            peak = max(peak, tracemalloc.get_traced_memory()[1] - base)
        tracemalloc.stop()
    timer.close()
    comm_s = timer.seconds * args.steps / (args.steps + 1)
    hits = getattr(getattr(wrapped, "prefetcher", None), "hits", 0)
    result = {"persistent": persistent_bytes(params, opt), "peak": peak,
              "step": float(np.median(times[1:])), "comm": comm_s / args.steps, "hits": hits}
    wrapped.close()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    dist.init()
    n = dist.size()
    results = {s: run(s, args) for s in ("dp", "fsdp", "fsdp-noprefetch", "fsdp-keep")}
    if dist.rank() == 0:
        mb = 1 / 2**20
        dp = results["dp"]
        print(f"{n} ranks, {args.units} units of width {args.width}, batch {args.batch}/rank")
        print(f"{'strategy':16s} {'persistent MB':>14s} {'/DP':>6s} {'peak MB':>9s} "
              f"{'step s':>8s} {'/DP':>6s} {'gather+rs s':>12s} {'prefetched':>10s}")
        for name, r in results.items():
            share = r["persistent"] / dp["persistent"]
            print(f"{name:16s} {r['persistent'] * mb:14.1f} {share:6.3f} {r['peak'] * mb:9.1f}"
                  f" {r['step']:8.3f} {r['step'] / dp['step']:6.2f}"
                  f" {r['comm']:12.3f} {r['hits']:10d}")
        print(f"goal: persistent/DP <= {1 / n * 1.05:.3f}; step/DP <= 1.5 at 2 ranks")


if __name__ == "__main__":
    main()
