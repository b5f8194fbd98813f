"""Shuffled reads from an HDF5 file: the DataLoader against reading sample by
sample and against fancy-indexing an array already in memory.

    python benchmarks/loader.py [--path FILE] [--n 200000] [--batches 300]

Writes an n x 784 float32 file with ``data.datasets.make_synthetic`` into a
temporary directory (deleted at the end) unless --path names an existing
one. One rank, DistributedSampler(shuffle=True), batches of 256; every method
reads the same first --batches batches of the epoch, in rounds (the methods
take turns, so machine noise hits all alike) and reports its median rate:

  loader_uncached  DataLoader over HDF5Dataset(cache=False): the file's
                   contiguous x and y read through a memory map, one fancy
                   index per batch, prefetched by a thread
  loader_h5py      the same with memory_map=False: one sorted, de-duplicated
                   h5py read per batch (the path for chunked/compressed data)
  loader_cached    DataLoader over HDF5Dataset(cache=True) (the file in memory)
  per_sample       f["x"][i], f["y"][i] per sample then np.stack: what a
                   PyTorch-style Dataset.__getitem__ plus collate does
  in_memory        x[idx], y[idx] on arrays in memory: the ceiling

Goals: loader_uncached >= 5x per_sample; loader_cached >= 0.5x in_memory.
The file was just written (or is read repeatedly), so the OS page cache holds
it: these are rates of the read path, not of the disk.
"""
import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from spmdnet.data import DataLoader, DistributedSampler, HDF5Dataset, datasets


class Solo:
    """One-rank communicator for the writer: no MPI needed here."""

    def Get_rank(self):
        return 0

    def Barrier(self):
        pass


def loader_rate(ds, sampler, batch, batches, prefetch):
    loader = DataLoader(ds, batch, sampler=sampler, prefetch=prefetch, device="cpu")
    samples, t0 = 0, time.perf_counter()
    for k, (x, _) in enumerate(loader):
        samples += len(x)
        if k + 1 == batches:
            break
    return samples / (time.perf_counter() - t0)


def per_sample_rate(path, index_batches):
    with h5py.File(path, "r") as f:
        xs, ys = f["x"], f["y"]
        samples, t0 = 0, time.perf_counter()
        for index in index_batches:
            items = [(xs[i], ys[i]) for i in index]  # Dataset.__getitem__, one by one
            x = np.stack([a for a, _ in items])  # default_collate
            samples += len(x)
        return samples / (time.perf_counter() - t0)


def in_memory_rate(x_all, y_all, index_batches):
    samples, t0 = 0, time.perf_counter()
    for index in index_batches:
        x, _ = x_all[index], y_all[index]
        samples += len(x)
    return samples / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--path", help="an existing HDF5 file with x and y (default: write one)")
    p.add_argument("--n", type=int, default=200_000, help="samples to write")
    p.add_argument("--features", type=int, default=784)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=300, help="batches per method per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prefetch", type=int, default=2)
    args = p.parse_args()

    tmp = None
    try:
        if args.path:
            path = args.path
        else:
            tmp = tempfile.mkdtemp(prefix="spmdnet-loader-")
            path = str(Path(tmp) / "synthetic.h5")
            t0 = time.perf_counter()
            datasets.make_synthetic(path, args.n, features=args.features, comm=Solo())
            print(f"wrote {path} ({Path(path).stat().st_size / 2**20:.0f} MiB) in "
                  f"{time.perf_counter() - t0:.1f} s")
        uncached = HDF5Dataset(path, cache=False)
        through_h5py = HDF5Dataset(path, cache=False, memory_map=False)
        t0 = time.perf_counter()
        cached = HDF5Dataset(path, cache=True)
        load_s = time.perf_counter() - t0
        x_all, y_all = cached._cache  # the same arrays in memory, for the ceiling
        with h5py.File(path, "r") as f:
            layout = f"chunks {f['x'].chunks}" if f["x"].chunks else "contiguous"
        n = len(uncached)
        sampler = DistributedSampler(n, num_replicas=1, rank=0, shuffle=True, seed=0)
        sampler.set_epoch(0)
        batches = min(args.batches, n // args.batch)
        order = sampler.indices()
        index_batches = [order[k * args.batch:(k + 1) * args.batch] for k in range(batches)]
        print(f"{n} x {uncached.sample_shape} {uncached.dtype} ({layout}), shuffled, batch "
              f"{args.batch}, {batches} batches x {args.rounds} rounds; cache load "
              f"{load_s:.1f} s")

        methods = {
            "loader_uncached": lambda: loader_rate(uncached, sampler, args.batch, batches,
                                                   args.prefetch),
            "loader_h5py": lambda: loader_rate(through_h5py, sampler, args.batch, batches,
                                               args.prefetch),
            "loader_cached": lambda: loader_rate(cached, sampler, args.batch, batches,
                                                 args.prefetch),
            "per_sample": lambda: per_sample_rate(path, index_batches),
            "in_memory": lambda: in_memory_rate(x_all, y_all, index_batches),
        }
        rates = {name: [] for name in methods}
        for _ in range(args.rounds):
            for name, fn in methods.items():
                rates[name].append(fn())
        rate = {name: statistics.median(r) for name, r in rates.items()}
        print(f"{'method':<16} {'samples/s':>12} {'MB/s':>9}   (median; all rounds)")
        row_mb = uncached.dtype.itemsize * int(np.prod(uncached.sample_shape)) / 1e6
        for name, r in rate.items():
            print(f"{name:<16} {r:>12,.0f} {r * row_mb:>9,.0f}   "
                  + " ".join(f"{v:,.0f}" for v in rates[name]))
        print(f"memory-mapped keys: {uncached.memory_mapped}")
        for label, num, den, goal in (
                ("loader_uncached / per_sample", "loader_uncached", "per_sample", 5.0),
                ("loader_cached / in_memory", "loader_cached", "in_memory", 0.5),
                ("loader_h5py / per_sample", "loader_h5py", "per_sample", None)):
            ratio = rate[num] / rate[den]
            verdict = ("for information" if goal is None else
                       f"goal >= {goal}: {'met' if ratio >= goal else 'MISSED'}")
            print(f"{label:<30} {ratio:7.2f}  ({verdict})")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
