"""Bus bandwidth of dist.allreduce against raw mpi4py Allreduce, with the
alpha-beta fit T(n) = alpha + beta * n of both, on the world.

    mpirun -n 2 python benchmarks/allreduce.py [--max-mb 64]

A short front end to ``python -m spmdnet.bench allreduce`` (which also
measures split communicators and writes CSV and PNG): message sizes from
4 KB to --max-mb, float32, interleaved (ours, raw) so machine noise hits
both alike; bus bandwidth = bytes/time * 2(p-1)/p, the NCCL convention.
Goal: ours >= 0.95 of raw from 1 MB up.
"""
import argparse

from spmdnet import dist
from spmdnet.bench import allreduce_bench as ab


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-mb", type=float, default=64)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    world = dist.init()
    sizes = ab.message_sizes(4096, int(args.max_mb * ab.MB))
    rows = ab.measure("world", world.comm, world.comm, sizes, args.reps)
    dist.print0(f"allreduce float32 on {world.size} ranks; median of up to {args.reps}; "
                "bus bandwidth GB/s")
    dist.print0(f"{'bytes':>10} {'ours_us':>10} {'raw_us':>10} {'ours_GB/s':>10} "
                f"{'raw_GB/s':>10} {'ours/raw':>9}")
    for ours, raw in zip(rows[0::2], rows[1::2]):
        dist.print0(f"{ours['bytes']:>10} {ours['time_s'] * 1e6:>10.1f} "
                    f"{raw['time_s'] * 1e6:>10.1f} {ours['busbw_GBps']:>10.2f} "
                    f"{raw['busbw_GBps']:>10.2f} {raw['time_s'] / ours['time_s']:>9.3f}")
    dist.print0("\n".join(ab.describe(ab.fits(rows))))


if __name__ == "__main__":
    main()
