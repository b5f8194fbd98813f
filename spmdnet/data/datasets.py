"""Datasets written as HDF5 files: the UCI handwritten digits kept in the
package, MNIST-format IDX files, and synthetic data of any size.

Files are written by rank 0 to a temporary name and renamed into place
(a crash never leaves a half-written file under the final name); the other
ranks wait at a barrier. Every file holds ``x`` (float32, scaled to [0, 1])
and ``y`` (int64 labels).
"""
import gzip
import os
from pathlib import Path

import numpy as np

from .. import distributed as dist

DIGITS_NPZ = Path(__file__).with_name("digits.npz")


def write_hdf5(path, x, y, comm=None, chunk_rows=None):
    """Write ``x`` and ``y`` to ``path`` atomically (rank 0), then barrier."""
    comm = dist.comm_or_default(comm)
    if comm.Get_rank() == 0:
        _write_atomically(path, lambda f: _fill(f, x, y, chunk_rows))
    dist.barrier(comm)
    return str(path)


def _fill(f, x, y, chunk_rows):
    chunks = (min(len(x), chunk_rows),) + x.shape[1:] if chunk_rows and len(x) else None
    f.create_dataset("x", data=x, chunks=chunks)
    f.create_dataset("y", data=y)


def _write_atomically(path, fill):
    import h5py  # noqa: PLC0415 - 0.1 s to import: on first write only
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            fill(f)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def digits():
    """The 1,797 8x8 UCI optical-recognition digits: x (n, 64) in [0, 1], y."""
    with np.load(DIGITS_NPZ) as d:
        x = d["images"].reshape(len(d["images"]), -1).astype(np.float32) / 16.0
        return x, d["labels"].astype(np.int64)


def split(x, y, test_fraction, seed):
    """A seeded random train/test split."""
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def make_digits(out_dir, test_fraction=0.2, seed=0, comm=None):
    """digits_train.h5 and digits_test.h5 in ``out_dir``; returns both paths."""
    (xtr, ytr), (xte, yte) = split(*digits(), test_fraction, seed)
    out = Path(out_dir)
    return (write_hdf5(out / "digits_train.h5", xtr, ytr, comm),
            write_hdf5(out / "digits_test.h5", xte, yte, comm))


def read_idx(path):
    """An array from an IDX file (MNIST / Fashion-MNIST format), gzipped or not."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (EOFError, gzip.BadGzipFile) as exc:
        raise ValueError(f"{path}: cannot decompress ({exc}; truncated?)") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4]!r})")
    dtype = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4",
             0x0E: ">f8"}.get(raw[2])
    if dtype is None:
        raise ValueError(f"{path}: unknown IDX element type 0x{raw[2]:02x}")
    ndim, header = raw[3], 4 + 4 * raw[3]
    if len(raw) < header:
        raise ValueError(f"{path}: the IDX header of a {ndim}-d array needs {header} bytes "
                         f"but the file holds {len(raw)} (truncated?)")
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if len(raw) - header != expected:
        raise ValueError(f"{path}: header says shape {shape} ({expected} bytes of data) but "
                         f"the file holds {len(raw) - header} bytes after the header "
                         "(truncated?)")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def make_mnist(images, labels, out_path, comm=None):
    """An HDF5 file from MNIST-format IDX images and labels; returns its path."""
    x = read_idx(images)
    y = read_idx(labels).astype(np.int64)
    if len(x) != len(y):
        raise ValueError(f"{images} has {len(x)} images but {labels} has {len(y)} labels")
    x = x.reshape(len(x), -1).astype(np.float32) / 255.0
    return write_hdf5(out_path, x, y, comm)


def synthetic(n, features=784, classes=10, seed=0):
    """A learnable problem: Gaussian clusters around class centres. The
    centres depend only on (features, classes) and ``seed`` picks the samples,
    so a train and a test set written with different seeds hold the same
    problem."""
    rng = np.random.default_rng(seed)
    return _draw(rng, _centres(features, classes), n)


def _centres(features, classes):
    rng = np.random.default_rng([features, classes])
    return rng.standard_normal((classes, features)).astype(np.float32)


def _draw(rng, centres, n):
    y = rng.integers(0, len(centres), n)
    x = centres[y] + rng.standard_normal((n, centres.shape[1]), dtype=np.float32) * 2.0
    return x, y.astype(np.int64)


def make_synthetic(out_path, n, features=784, classes=10, seed=0, comm=None):
    """A synthetic HDF5 file of any size, generated and written 16,384 rows at a
    time (for n <= 16,384 exactly ``synthetic(n, ...)``); ``x`` is
    stored contiguous, the fastest layout for shuffled reads."""
    comm = dist.comm_or_default(comm)
    rows = 16384

    def fill(f):
        xs = f.create_dataset("x", (n, features), np.float32)
        ys = f.create_dataset("y", (n,), np.int64)
        rng, centres = np.random.default_rng(seed), _centres(features, classes)
        for start in range(0, n, rows):
            x, y = _draw(rng, centres, min(rows, n - start))
            xs[start:start + len(x)], ys[start:start + len(y)] = x, y

    if comm.Get_rank() == 0:
        _write_atomically(out_path, fill)
    dist.barrier(comm)
    return str(out_path)
