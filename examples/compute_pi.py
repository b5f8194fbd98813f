"""The classic first MPI program: pi as the integral of 4/(1+x^2) over [0, 1].

    mpirun -n 4 python examples/compute_pi.py [--intervals 10000000]

Each rank integrates its strided share of the intervals (midpoint rule) and
one allreduce sums the shares. Works as plain ``python`` too (one rank).
"""
import argparse
import math
import time

import numpy as np

from spmdnet import cli, dist


def partial_sum(n, rank, size, chunk=1_000_000):
    """Midpoint rule over intervals rank, rank+size, ... (chunked: bounded memory)."""
    h, total = 1.0 / n, 0.0
    for start in range(rank, n, size * chunk):
        i = np.arange(start, min(n, start + size * chunk), size, dtype=np.float64)
        x = h * (i + 0.5)
        total += float(np.sum(4.0 / (1.0 + x * x)))
    return total * h


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--intervals", type=cli.positive_int, default=10_000_000)
    args = p.parse_args(argv)
    dist.init()
    t0 = time.perf_counter()
    pi = dist.allreduce(partial_sum(args.intervals, dist.rank(), dist.size()))
    seconds = time.perf_counter() - t0
    error = abs(pi - math.pi)
    dist.print0(f"pi ~ {pi:.15f} (error {error:.2e}) on {dist.size()} ranks "
                f"in {seconds * 1e3:.1f} ms")
    return 0 if error < 1e-8 else 1


if __name__ == "__main__":
    dist.finalize_and_exit(main())
