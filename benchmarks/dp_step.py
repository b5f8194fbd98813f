"""Data-parallel training step: time, speedup and exposed communication.

    python benchmarks/dp_step.py [--ranks 1 2] [--steps 40] [--bucket-mb 25]

The MLP of benchmarks/mlp_step.py (784-1024-1024-10, float32, SGD momentum),
global batch 256 split over the ranks, one BLAS thread per rank. The script
launches itself under ``mpiexec -n N`` for each N. In one run, steps of four
variants are interleaved (so machine noise hits all alike):
  nocomm       the same local step with no communication at all: the ceiling
  nonblocking  DataParallel, Iallreduce started as buckets fill
  thread       DataParallel, blocking Allreduce on a communication thread
  none         DataParallel, all buckets reduced after backward
Printed per N and variant: median step time, speedup over N=1 of the same
variant, and exposed communication (time backward waited for allreduces
after its computation ended) as a share of the step.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SIZES = (784, 1024, 1024, 10)
GLOBAL_BATCH = 256
VARIANTS = ("nocomm", "nonblocking", "thread", "none")


def build(variant, bucket_mb):
    import spmdnet as sn
    from spmdnet import nn, optim, parallel
    sn.manual_seed(0)
    layers = []
    for i, o in zip(SIZES[:-1], SIZES[1:]):
        layers += [nn.Linear(i, o), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    wrapped = model if variant == "nocomm" else \
        parallel.DataParallel(model, overlap=variant, bucket_mb=bucket_mb)
    return wrapped, optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def child(steps, bucket_mb):
    import numpy as np
    from mpi4py import MPI

    import spmdnet as sn
    import spmdnet.functional as F
    from spmdnet import dist

    world = dist.init()
    runs = {v: build(v, bucket_mb) for v in VARIANTS}
    local = GLOBAL_BATCH // world.size
    rng = np.random.default_rng(world.rank)
    x = sn.Tensor(rng.standard_normal((local, SIZES[0])).astype(np.float32))
    y = rng.integers(0, SIZES[-1], local)
    times = {v: [] for v in VARIANTS}
    exposed = {v: [] for v in VARIANTS}
    for step in range(steps + 5):
        for v, (model, opt) in runs.items():
            world.comm.Barrier()
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step >= 5:  # warm-up: JIT compilation, first allocations
                times[v].append(time.perf_counter() - t0)
                exposed[v].append(getattr(model, "last_exposed_comm_s", 0.0))
    result = {"ranks": world.size}
    for v in VARIANTS:  # the slowest rank defines the step
        result[v] = [world.comm.allreduce(float(np.median(times[v])), op=MPI.MAX),
                     world.comm.allreduce(float(np.median(exposed[v])), op=MPI.MAX)]
    if world.rank == 0:
        print(json.dumps(result))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.steps, args.bucket_mb)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    mpiexec = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(mpiexec) if mpiexec.exists() else "mpiexec"
    print(f"MLP {'-'.join(map(str, SIZES))}, global batch {GLOBAL_BATCH}, float32, SGD "
          f"momentum, 1 BLAS thread per rank, bucket_mb={args.bucket_mb}, median of "
          f"{args.steps} steps")
    print(f"{'ranks':>5} {'variant':>12} {'step_ms':>8} {'speedup':>8} {'exposed_ms':>10} "
          f"{'exposed%':>9}")
    base = {}
    for n in args.ranks:
        out = subprocess.run([mpiexec, "-n", str(n), sys.executable, __file__, "--child",
                              "--steps", str(args.steps), "--bucket-mb", str(args.bucket_mb)],
                             env=env, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        for v in VARIANTS:
            step, exp = r[v]
            base.setdefault(v, step * n)  # the first run (normally N=1) is the base
            print(f"{n:>5} {v:>12} {step * 1e3:>8.2f} {base[v] / n / step * n:>8.2f} "
                  f"{exp * 1e3:>10.2f} {100 * exp / step:>8.1f}%")


if __name__ == "__main__":
    main()
