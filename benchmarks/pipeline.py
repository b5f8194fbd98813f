"""Pipeline (GPipe) step time and bubble against micro-batch count, pp=2.

    mpirun -n 2 python benchmarks/pipeline.py [--batch 256] [--hidden 1024]

An MLP of 4 hidden layers cut into 2 stages. For m micro-batches, the step
time T(m) is measured next to the per-stage busy time (forward + backward
work of one micro-batch, times m); the measured bubble is 1 - busy/T, shown
next to the formula (p - 1)/(m + p - 1). On this 2-core machine both stages
get a core, so the pipeline can overlap them.
"""
import argparse
import time

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, parallel


def stage_model(rank, hidden, features, classes):
    sn.manual_seed(rank)
    if rank == 0:
        return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                             nn.ReLU())
    return nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def time_steps(pipe, x, y, reps):
    times = []
    for _ in range(reps + 1):  # the first is warm-up: kernel compilation, allocations
        pipe.comm.Barrier()
        t0 = time.perf_counter()
        pipe.train_step(x, y, F.cross_entropy)
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def busy_time(stage, rank, x, hidden, reps):
    """One stage's own work for a batch x (no communication)."""
    inp = x if rank == 0 else np.random.default_rng(0).standard_normal(
        (len(x), hidden)).astype(np.float32)
    times = []
    for _ in range(reps + 1):  # the first is warm-up
        t0 = time.perf_counter()
        out = stage(sn.Tensor(inp, requires_grad=rank > 0))
        out.sum().backward()
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    world = dist.init()
    if world.size != 2:
        raise SystemExit("run with exactly 2 ranks: mpirun -n 2 python benchmarks/pipeline.py")
    mesh = dist.Mesh(pp=2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    stage = stage_model(mesh.pp_rank, args.hidden, 784, 10)
    busy = busy_time(stage, mesh.pp_rank, x, args.hidden, args.reps)
    busy = dist.allreduce(busy, op="max", comm=mesh.pp)
    dist.print0(f"pp=2, batch {args.batch}, hidden {args.hidden}; slowest stage's work for "
                f"the whole batch {busy * 1e3:.2f} ms")
    dist.print0(f"{'m':>3} {'step_ms':>8} {'bubble':>8} {'formula':>8}")
    for m in (1, 2, 4, 8, 16):
        if args.batch % m:
            continue
        pipe = parallel.Pipeline(stage, mesh.pp, micro_batches=m)
        step = time_steps(pipe, x, y, args.reps)
        dist.print0(f"{m:>3} {step * 1e3:>8.2f} {1 - busy / step:>8.3f} "
                    f"{parallel.pipeline.bubble_fraction(2, m):>8.3f}")
    mesh.free()


if __name__ == "__main__":
    main()
