"""Tensor-parallel training step: time and bytes communicated, tp=1 vs tp=N.

    python benchmarks/tp_step.py [--ranks 2] [--hidden 4096] [--batch 64] [--steps 10]

A wide MLP block, hidden -> hidden -> hidden (Column then Row, GELU between;
float32, plain SGD), global batch --batch, one BLAS thread per rank. The
script launches itself under ``mpiexec -n N`` and interleaves three variants
(so machine noise hits all alike):
  serial   every rank runs the whole dense step alone (no communication)
  tp1      tp=1 x dp=N: DataParallel, local batch = batch/N, gradients allreduced
  tpN      tp=N x dp=1: the block split over the ranks, every rank the whole batch
Bytes are counted by wrapping the collectives (``dist.allreduce`` and
``dist.allgather`` that the differentiable collectives call, and the
DataParallel reducer's bucket reductions): the payload one rank hands to
allreduce per step. A ring allreduce sends 2(N-1)/N times that per rank.
Analytical counts: TP, one allreduce of batch x hidden per column+row pair
in forward (reduce_from_group) and one in backward (copy_to_group; the input
requires grad, as it does inside a deep network); DP, every gradient once.
"""
import argparse
import json
import time

import numpy as np

import spmdnet as sn
from spmdnet import dist, launch, nn, optim, parallel

VARIANTS = ("serial", "tp1", "tpN")


class Counter:
    """Payload bytes handed to collectives since the last reset."""

    def __init__(self):
        self.bytes = 0

    def wrap(self, fn):
        def counted(x, *args, **kwargs):
            self.bytes += getattr(getattr(x, "array", x), "nbytes", 0)  # a Python scalar: 0
            return fn(x, *args, **kwargs)
        return counted


class CountingReducer:
    """DataParallel's reducer, counting each bucket it reduces."""

    def __init__(self, inner, counter):
        self.inner, self.counter = inner, counter

    def start(self, bucket):
        self.counter.bytes += bucket.buffer.nbytes
        self.inner.start(bucket)

    def wait(self, bucket):
        self.inner.wait(bucket)

    def poke(self):
        self.inner.poke()

    def close(self):
        self.inner.close()


def build(variant, hidden, mesh, counter):
    """(callable model, parameters) for one variant, all from seed 0."""
    sn.manual_seed(0)
    if variant == "serial":
        model = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        return model, list(model.parameters())
    comm = mesh["tpN"].tp if variant == "tpN" else mesh["tp1"].tp
    model = nn.Sequential(parallel.ColumnParallelLinear(hidden, hidden, comm), nn.GELU(),
                          parallel.RowParallelLinear(hidden, hidden, comm))
    if variant == "tpN":
        return model, list(model.parameters())
    ddp = parallel.DataParallel(model, comm=mesh["tp1"].dp)
    ddp.reducer = CountingReducer(ddp.reducer, counter)
    return ddp, list(model.parameters())


def child(args):
    world = dist.init()
    n = world.size
    counter = Counter()
    slowest = dist.allreduce  # not counted
    dist.allreduce, dist.allgather = counter.wrap(dist.allreduce), counter.wrap(dist.allgather)
    mesh = {"tp1": dist.Mesh(tp=1), "tpN": dist.Mesh(tp=n)}
    runs = {}
    for v in VARIANTS:
        model, params = build(v, args.hidden, mesh, counter)
        runs[v] = model, optim.SGD(params, lr=1e-3)
    rng = np.random.default_rng(0)
    x_full = rng.standard_normal((args.batch, args.hidden)).astype(np.float32)
    local = args.batch // n
    inputs = {"serial": x_full, "tpN": x_full,
              "tp1": x_full[world.rank * local:(world.rank + 1) * local]}
    result = {"ranks": n, **timed_steps(
        world, runs, args.steps, counter, slowest, lambda v, model, x: (model(x) ** 2).mean(),
        lambda v: sn.tensor(inputs[v], requires_grad=True))}
    if world.rank == 0:
        print(json.dumps(result))


def timed_steps(world, runs, steps, counter, slowest, loss_of, make_input=lambda v: None):
    """Interleave the steps of ``runs`` ({variant: (model, optimizer)}), after 3
    of warm-up (first allocations, BLAS start-up, kernel compilation); returns
    {variant: [the slowest rank's median step (``slowest``: the uncounted
    allreduce), the median payload bytes]}. ``loss_of(v, model, make_input(v))``:
    the step's loss, its input made before the clock starts."""
    times, sent = {v: [] for v in runs}, {v: [] for v in runs}
    for i in range(steps + 3):
        for v, (model, opt) in runs.items():
            x = make_input(v)
            world.comm.Barrier()
            counter.bytes = 0
            t0 = time.perf_counter()
            loss = loss_of(v, model, x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i >= 3:
                times[v].append(time.perf_counter() - t0)
                sent[v].append(counter.bytes)
    return {v: [slowest(float(np.median(times[v])), op="max"), int(np.median(sent[v]))]
            for v in runs}


def analytical(variant, n, hidden, batch, itemsize=4):
    if variant == "serial" or n == 1:
        return 0
    if variant == "tpN":
        return 2 * batch * hidden * itemsize  # one pair: one allreduce each way
    return (2 * hidden * hidden + hidden + hidden) * itemsize  # every gradient


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if args.hidden % args.ranks or args.batch % args.ranks:
        p.error(f"--hidden {args.hidden} and --batch {args.batch} must divide by "
                f"--ranks {args.ranks}")
    r = launch.run_child(args.ranks, __file__, "--hidden", args.hidden, "--batch", args.batch,
                         "--steps", args.steps)
    n = args.ranks
    print(f"MLP block {args.hidden}-{args.hidden}-{args.hidden} (column+row, GELU), global "
          f"batch {args.batch}, float32, SGD, {n} ranks, 1 BLAS thread each, median of "
          f"{args.steps} steps")
    print(f"{'variant':>16} {'step_ms':>8} {'speedup':>8} {'MB/step':>9} {'analytic MB':>12}")
    names = {"serial": "serial (1 rank)", "tp1": f"tp=1 x dp={n}", "tpN": f"tp={n} x dp=1"}
    for v in VARIANTS:
        step, nbytes = r[v]
        want = analytical(v, n, args.hidden, args.batch)
        print(f"{names[v]:>16} {step * 1e3:>8.1f} {r['serial'][0] / step:>8.2f} "
              f"{nbytes / 1e6:>9.3f} {want / 1e6:>12.3f}")


if __name__ == "__main__":
    main()
