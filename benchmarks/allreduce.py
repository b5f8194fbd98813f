"""Bus bandwidth of dist.allreduce against raw mpi4py Allreduce, with the
alpha-beta fit T(n) = alpha + beta * n of both.

    mpirun -n 2 python benchmarks/allreduce.py [--max-mb 64]

Message sizes from 4 KB to --max-mb, float32, interleaved (ours, raw) so
machine noise hits both alike; bus bandwidth = bytes/time * 2(p-1)/p, the
NCCL convention, so numbers compare across rank counts. Goal: ours >= 0.95
of raw from 1 MB up.
"""
import argparse
import time

import numpy as np
from mpi4py import MPI

from spmdnet import dist


def time_pair(fns, reps, comm):
    """Median seconds of each fn, alternating them rep by rep."""
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    # the slowest rank defines a collective's time
    return [comm.allreduce(sorted(ts)[len(ts) // 2], op=MPI.MAX) for ts in times]


def fit_alpha_beta(nbytes, seconds):
    """T = alpha + beta * n by least squares on relative error (weights 1/T),
    so small messages fix alpha and large ones beta; returns (alpha, beta)."""
    t = np.asarray(seconds, float)
    beta, alpha = np.polyfit(np.asarray(nbytes, float), t, 1, w=1 / t)
    return alpha, beta


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-mb", type=float, default=64)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    world = dist.init()
    comm, size = world.comm, world.size
    factor = 2 * (size - 1) / size if size > 1 else 1.0
    sizes, n = [], 4096
    while n <= args.max_mb * 2**20:
        sizes.append(n)
        n *= 4
    dist.print0(f"allreduce float32 on {size} ranks; median of {args.reps}; "
                "bus bandwidth GB/s")
    dist.print0(f"{'bytes':>10} {'ours_us':>10} {'raw_us':>10} {'ours_GB/s':>10} "
                f"{'raw_GB/s':>10} {'ours/raw':>9}")
    rows = []
    for nbytes in sizes:
        a = np.ones(nbytes // 4, np.float32)
        b = np.ones(nbytes // 4, np.float32)
        reps = max(5, args.reps if nbytes < 2**24 else args.reps // 4)
        ours, raw = time_pair([lambda a=a: dist.allreduce(a),
                               lambda b=b: comm.Allreduce(MPI.IN_PLACE, b, MPI.SUM)],
                              reps, comm)
        rows.append((nbytes, ours, raw))
        dist.print0(f"{nbytes:>10} {ours * 1e6:>10.1f} {raw * 1e6:>10.1f} "
                    f"{nbytes * factor / ours / 1e9:>10.2f} {nbytes * factor / raw / 1e9:>10.2f} "
                    f"{raw / ours:>9.3f}")
    for name, col in (("ours", 1), ("raw", 2)):
        alpha, beta = fit_alpha_beta([r[0] for r in rows], [r[col] for r in rows])
        dist.print0(f"alpha-beta fit ({name}): alpha = {alpha * 1e6:.1f} us, "
                    f"beta = {beta * 1e9:.3f} ns/byte ({1 / beta / 1e9:.2f} GB/s), "
                    f"half-peak size n_1/2 = alpha/beta = {alpha / beta / 1e3:.0f} KB")
    big = [raw / ours for nbytes, ours, raw in rows if nbytes >= 2**20]
    dist.print0(f"ours/raw bandwidth from 1 MB up: min {min(big):.3f}, "
                f"mean {np.mean(big):.3f} (goal >= 0.95)")


if __name__ == "__main__":
    main()
