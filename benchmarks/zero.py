"""ZeRO-1 and ZeRO-2 against plain DataParallel + Adam: gradient and
optimizer-state bytes per rank, peak memory and step time, interleaved in one run.

    mpirun -n 2 python benchmarks/zero.py [--hidden 1024] [--steps 20]

Variants: "ddp" (DataParallel + Adam: every rank keeps all gradients and the
whole state), "zero1" (DataParallel + ZeroRedundancyOptimizer(Adam): state /
P, one extra allgather of parameters), "zero-rs" (stage 1 with
reduce_gradients=True and no DataParallel: reduce-scatter at step() +
allgather, the bytes of one allreduce), "zero2" (stage=2: gradients
reduce-scattered during backward, each rank keeping its gradient shard).
Printed per variant: persistent gradient and state bytes between steps,
their sum's ratio to "ddp" (goal for zero2: about 1/P), the peak traced
allocation above the step's start (tracemalloc, a separate pass) and the
median step time.
"""
import argparse
import time
import tracemalloc

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel


def build(variant, hidden, bucket_mb):
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                          nn.ReLU(), nn.Linear(hidden, 10))
    if variant == "ddp":
        return (parallel.DataParallel(model, bucket_mb=bucket_mb),
                optim.Adam(model.parameters(), lr=1e-3))
    wrapped = parallel.DataParallel(model, bucket_mb=bucket_mb) if variant == "zero1" else model
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.Adam,
                                          reduce_gradients=variant == "zero-rs",
                                          stage=2 if variant == "zero2" else 1,
                                          bucket_mb=bucket_mb, lr=1e-3)
    return wrapped, zo


def state_bytes(opt):
    if isinstance(opt, parallel.ZeroRedundancyOptimizer):
        return opt.state_bytes()
    return sum(v.nbytes for s in opt.state.values() for k, v in s.items()
               if hasattr(v, "nbytes") and not k.startswith("_"))


def grad_bytes(model, opt):
    """Gradient arrays held between steps (DataParallel: its bucket buffers)."""
    if isinstance(opt, parallel.ZeroRedundancyOptimizer):
        return opt.grad_bytes()
    return sum(b.buffer.nbytes for b in model.buckets)


def step(model, opt, x, y):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def peak_bytes(model, opt, x, y):
    """Peak traced allocation during one step above its start."""
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    step(model, opt, x, y)
    peak = tracemalloc.get_traced_memory()[1] - start
    tracemalloc.stop()
    return peak


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--bucket-mb", type=float, default=25.0,
                   help="DataParallel's and ZeRO-2's bucket cap")
    args = p.parse_args()
    world = dist.init()
    runs = {v: build(v, args.hidden, args.bucket_mb) for v in ("ddp", "zero1", "zero-rs", "zero2")}
    rng = np.random.default_rng(world.rank)
    x = sn.Tensor(rng.standard_normal((args.batch, 784)).astype(np.float32))
    y = rng.integers(0, 10, args.batch)
    times = {v: [] for v in runs}
    for i in range(args.steps + 3):
        for v, (model, opt) in runs.items():
            world.comm.Barrier()
            t0 = time.perf_counter()
            step(model, opt, x, y)
            if i >= 3:
                times[v].append(time.perf_counter() - t0)
    peaks = {v: peak_bytes(model, opt, x, y) for v, (model, opt) in runs.items()}
    dist.print0(f"{world.size} ranks, MLP 784-{args.hidden}-{args.hidden}-10, Adam, batch "
                f"{args.batch}/rank, buckets {args.bucket_mb} MB, median of {args.steps} "
                "interleaved steps; MiB per rank")
    dist.print0(f"{'variant':>8} {'grads':>8} {'state':>8} {'grad+state':>10} {'/ddp':>6} "
                f"{'peak':>8} {'step_ms':>8} {'/ddp':>6}")
    base = None
    for v, (model, opt) in runs.items():  # "ddp" first: the base of the ratios
        g = dist.allreduce(int(grad_bytes(model, opt)), op="max")
        b = dist.allreduce(int(state_bytes(opt)), op="max")
        peak = dist.allreduce(int(peaks[v]), op="max")
        t = dist.allreduce(float(np.median(times[v])), op="max")
        base = base or (g + b, t)
        dist.print0(f"{v:>8} {g / 2**20:>8.2f} {b / 2**20:>8.2f} {(g + b) / 2**20:>10.2f} "
                    f"{(g + b) / base[0]:>6.3f} {peak / 2**20:>8.2f} {t * 1e3:>8.2f} "
                    f"{t / base[1]:>6.3f}")


if __name__ == "__main__":
    main()
