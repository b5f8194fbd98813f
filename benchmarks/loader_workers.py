"""DataLoader worker processes on a slow per-item dataset: samples/s at each
worker count and the speed-up over ``num_workers=0``.

    python benchmarks/loader_workers.py [--kind io|cpu] [--n 512] [--batch 32]
                                        [--workers 0 1 2 4] [--ms 2]

``io``: each ``__getitem__`` waits ``--ms`` milliseconds (the latency of a
network file system or object store), then returns a 3x32x32 image; workers
overlap the waits, so the speed-up grows with the worker count. ``cpu``:
each ``__getitem__`` computes for about ``--ms`` milliseconds (an image
decode): the speed-up is bounded by the cores free for the workers. The
loader runs in one process (no MPI); every count reads the same shuffled
epoch and the batches are checked equal to those of ``num_workers=0``.
"""
import argparse
import time

import numpy as np

import spmdnet as sn
from spmdnet.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, n, kind, ms):
        self.n, self.kind, self.ms = n, kind, ms
        self.images = np.random.default_rng(0).random((n, 3, 32, 32), dtype=np.float32)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.kind == "io":
            time.sleep(self.ms / 1000)
        else:
            stop = time.perf_counter() + self.ms / 1000
            while time.perf_counter() < stop:  # busy work, holding the GIL as Python does
                np.fft.rfft2(self.images[i])
        return self.images[i], i % 10


def rate(ds, workers, batch):
    loader = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                        generator=sn.Generator().manual_seed(1))
    t0 = time.perf_counter()
    labels = [y.tolist() for _, y in loader]
    return len(ds) / (time.perf_counter() - t0), labels


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kind", choices=["io", "cpu"], default="io")
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--ms", type=float, default=2.0, help="milliseconds per sample")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4])
    args = p.parse_args()
    ds = Slow(args.n, args.kind, args.ms)
    base, reference = None, None
    print(f"{args.kind}: {args.n} samples of {args.ms:g} ms, batch {args.batch}")
    for workers in args.workers:
        r, labels = rate(ds, workers, args.batch)
        if reference is None:
            base, reference = r, labels
        assert labels == reference, "the batches differ from those of the first count"
        print(f"num_workers={workers:<3d} {r:10,.0f} samples/s   speed-up {r / base:5.2f}")


if __name__ == "__main__":
    main()
