"""ZeRO-1 against plain DataParallel + Adam: optimizer-state bytes per rank
and step time, interleaved in one run.

    mpirun -n 2 python benchmarks/zero.py [--hidden 1024] [--steps 20]

Variants: "ddp" (DataParallel + Adam: every rank keeps the whole state),
"zero" (DataParallel + ZeroRedundancyOptimizer(Adam): state / P, one extra
allgather of parameters), "zero-rs" (ZeroRedundancyOptimizer with
reduce_gradients=True and no DataParallel: reduce-scatter + allgather, the
bytes of one allreduce). Printed per variant, next to the figures: their
ratios to "ddp" (goal: state/ddp about 1/P for both ZeRO variants).
"""
import argparse
import time

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel


def build(variant, hidden):
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                          nn.ReLU(), nn.Linear(hidden, 10))
    if variant == "ddp":
        return parallel.DataParallel(model), optim.Adam(model.parameters(), lr=1e-3)
    wrapped = parallel.DataParallel(model) if variant == "zero" else model
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.Adam,
                                          reduce_gradients=variant == "zero-rs", lr=1e-3)
    return wrapped, zo


def state_bytes(opt):
    if isinstance(opt, parallel.ZeroRedundancyOptimizer):
        return opt.state_bytes()
    return sum(v.nbytes for s in opt.state.values() for k, v in s.items()
               if hasattr(v, "nbytes") and not k.startswith("_"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    world = dist.init()
    runs = {v: build(v, args.hidden) for v in ("ddp", "zero", "zero-rs")}
    rng = np.random.default_rng(world.rank)
    x = sn.Tensor(rng.standard_normal((args.batch, 784)).astype(np.float32))
    y = rng.integers(0, 10, args.batch)
    times = {v: [] for v in runs}
    for step in range(args.steps + 3):
        for v, (model, opt) in runs.items():
            world.comm.Barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if step >= 3:
                times[v].append(time.perf_counter() - t0)
    dist.print0(f"{world.size} ranks, MLP 784-{args.hidden}-{args.hidden}-10, Adam, batch "
                f"{args.batch}/rank, median of {args.steps} interleaved steps")
    dist.print0(f"{'variant':>8} {'state_MiB/rank':>15} {'step_ms':>8} {'state/ddp':>10} "
                f"{'step/ddp':>9}")
    base = None
    for v, (_, opt) in runs.items():  # "ddp" first: the base of the ratios
        b = dist.allreduce(int(state_bytes(opt)), op="max")
        t = dist.allreduce(float(np.median(times[v])), op="max")
        base = base or (b, t)
        dist.print0(f"{v:>8} {b / 2**20:>15.2f} {t * 1e3:>8.2f} {b / base[0]:>10.3f} "
                    f"{t / base[1]:>9.3f}")


if __name__ == "__main__":
    main()
