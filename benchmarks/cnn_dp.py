"""Data-parallel CIFAR-10 CNN step: strong scaling and the cost of SyncBatchNorm.

    python benchmarks/cnn_dp.py [--ranks 1 2] [--batch 128] [--steps 20]

The course CIFAR-10 net of benchmarks/cnn_step.py under DataParallel,
global batch --batch split over the ranks (strong scaling), float32,
SGD with momentum, cross-entropy. For each rank count the script launches
itself under ``mpiexec -n N`` (spmdnet.launch: one BLAS thread per rank) and
interleaves three variants of the same net (so machine noise hits all alike):
  net    the net as is
  bn     BatchNorm2d after each convolution (before its ReLU); under
         DataParallel its buffers are broadcast from rank 0 each forward
  sync   the same with SyncBatchNorm over the world (one allreduce of the
         statistics in forward, one in backward)
A step is the slowest rank's median. Printed: ms per step, the speedup of
each variant over its own 1-rank step (when 1 is among --ranks) and
sync - bn, the cost of SyncBatchNorm over plain BatchNorm (ms per step).
"""
import argparse
import json
import time

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, launch, nn, optim, parallel

from cnn_step import Net  # benchmarks/ is on the path of a script run

VARIANTS = ("net", "bn", "sync")


class NetBN(Net):
    """The CIFAR net with BatchNorm2d after each convolution."""

    def __init__(self):
        super().__init__()
        self.bn1, self.bn2 = nn.BatchNorm2d(6), nn.BatchNorm2d(16)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = F.relu(self.fc1(x.view(-1, 16 * 5 * 5)))
        return self.fc3(F.relu(self.fc2(x)))


def build(variant):
    sn.manual_seed(0)
    model = Net() if variant == "net" else NetBN()
    if variant == "sync":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ddp = parallel.DataParallel(model)
    return ddp, optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)


def child(args):
    world = dist.init()
    n, rank = world.size, world.rank
    local = args.batch // n
    rng = np.random.default_rng(rank)
    x = sn.tensor(rng.standard_normal((local, 3, 32, 32)).astype(np.float32))
    y = rng.integers(0, 10, local)
    runs = {v: build(v) for v in VARIANTS}
    times = {v: [] for v in VARIANTS}
    for i in range(args.steps + 3):
        for v, (ddp, opt) in runs.items():
            world.comm.Barrier()
            t0 = time.perf_counter()
            loss = F.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i >= 3:  # warm-up: kernel compilation, first allocations
                times[v].append(time.perf_counter() - t0)
    result = {v: dist.allreduce(float(np.median(times[v])), op="max") for v in VARIANTS}
    for ddp, _ in runs.values():
        ddp.close()
    if rank == 0:
        print(json.dumps(result))


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("--batch", 128), ("--steps", 20)):
        p.add_argument(name, type=int, default=default)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    bad = [n for n in args.ranks if args.batch % n]
    if bad:
        p.error(f"--batch {args.batch} must divide by every --ranks ({bad})")
    return args


def main():
    args = parse()
    if args.child:
        return child(args)
    print(f"CIFAR-10 CNN under DataParallel, global batch {args.batch}, 3x32x32, float32, "
          f"SGD momentum, 1 BLAS thread per rank; slowest rank's median of {args.steps} "
          "interleaved steps (ms)")
    print(f"{'ranks':>5} {'net_ms':>8} {'bn_ms':>8} {'sync_ms':>8} {'sync-bn':>8} "
          f"{'net_x':>6} {'bn_x':>6} {'sync_x':>6}")
    base = None
    for n in args.ranks:
        r = launch.run_child(n, __file__, "--batch", args.batch, "--steps", args.steps)
        base = r if n == 1 else base
        speed = " ".join(f"{base[v] / r[v]:>6.2f}" if base else f"{'-':>6}" for v in VARIANTS)
        print(f"{n:>5} {r['net'] * 1e3:>8.2f} {r['bn'] * 1e3:>8.2f} {r['sync'] * 1e3:>8.2f} "
              f"{(r['sync'] - r['bn']) * 1e3:>8.2f} {speed}", flush=True)
    return 0


if __name__ == "__main__":
    main()
