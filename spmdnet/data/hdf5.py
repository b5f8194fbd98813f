"""HDF5Dataset: batches read from an HDF5 file, one h5py read per batch.

The file is opened lazily, read-only, by each process on first access and
reopened after a fork (an h5py handle must never cross a fork). Validation
happens at construction, so a bad path, key or length fails before training
with the path in the message. ``ds[indices]`` sorts and de-duplicates the
indices, reads them with one fancy-indexed h5py read, and restores the
requested order: never sample by sample.

Files are opened with a small HDF5 sieve buffer (``SIEVE_BYTES``): HDF5's
default of 64 KiB makes every row of a sparse (shuffled) selection from a
contiguous dataset load 64 KiB, which made a batch read barely faster than
reading sample by sample (benchmarks/loader.py). For random access, store
``x`` contiguous (the writers in ``datasets`` do) or in chunks of few rows: a
read touches whole chunks, so chunks of hundreds of rows read hundreds of
rows per sample.
"""
import os

import numpy as np

from .. import backend

SIEVE_BYTES = 4096  # HDF5's data sieve buffer per open file (default 64 KiB); see above


def _rank():
    from ..dist.world import rank_label  # noqa: PLC0415
    return rank_label()


def _h5py():
    import h5py  # noqa: PLC0415 - imported on first use
    return h5py


class HDF5Dataset:
    """Samples ``x[i]`` (and labels ``y[i]``) of datasets in an HDF5 file.

    ``locking`` is h5py's file-locking option (None: HDF5's default; True,
    False, or "best-effort"; False helps on shared filesystems without lock
    support); ``cache`` is True, False or "auto" (load the whole file
    into memory when it is at most ``cache_bytes``).
    """

    def __init__(self, path, x="x", y="y", locking=None, cache="auto",
                 cache_bytes=256 * 2**20):
        self.path, self.x_key, self.y_key = str(path), x, y
        if locking not in (None, True, False, "best-effort"):
            raise ValueError(f"locking must be None, True, False or 'best-effort', got "
                             f"{locking!r}")
        if cache not in (True, False, "auto"):
            raise ValueError(f"cache must be True, False or 'auto', got {cache!r}")
        self.locking = locking
        self._file, self._pid, self._cache = None, None, None
        f = self._open()
        try:
            self._validate(f)
            nbytes = f[x].size * f[x].dtype.itemsize + (f[y].size * f[y].dtype.itemsize
                                                         if y else 0)
            if cache is True or (cache == "auto" and nbytes <= cache_bytes):
                self._cache = (f[x][...], f[y][...] if y else None)
        finally:
            f.close()  # reopened per process at first read

    # -- file handling -------------------------------------------------------------
    def _open(self):
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"HDF5 dataset {self.path} does not exist (rank {_rank()})")
        h5py = _h5py()
        fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
        fapl.set_fclose_degree(h5py.h5f.CLOSE_WEAK)  # as h5py.File does
        fapl.set_sieve_buf_size(SIEVE_BYTES)
        if self.locking is not None:
            fapl.set_file_locking(bool(self.locking),
                                  ignore_when_disabled=self.locking == "best-effort")
        try:
            return h5py.File(h5py.h5f.open(os.fsencode(self.path), h5py.h5f.ACC_RDONLY,
                                           fapl=fapl))
        except OSError as exc:
            raise OSError(f"cannot open HDF5 dataset {self.path} on rank {_rank()}: {exc}") \
                from exc

    def _validate(self, f):
        keys = sorted(f.keys())
        for key in (self.x_key, self.y_key):
            if key is not None and key not in f:
                raise KeyError(f"HDF5 dataset {self.path} has no key {key!r}; keys present: "
                               f"{keys}")
            if key is not None and (not isinstance(f[key], _h5py().Dataset) or f[key].ndim < 1):
                raise ValueError(f"HDF5 dataset {self.path}: {key!r} is not an array of "
                                 f"samples ({f[key]})")
        if self.y_key is not None and len(f[self.x_key]) != len(f[self.y_key]):
            raise ValueError(f"HDF5 dataset {self.path}: {self.x_key!r} has "
                             f"{len(f[self.x_key])} samples but {self.y_key!r} has "
                             f"{len(f[self.y_key])}")
        self._len = len(f[self.x_key])
        self.sample_shape = f[self.x_key].shape[1:]
        self.dtype = f[self.x_key].dtype

    def _handle(self):
        """This process's open file (reopened in a forked child)."""
        if self._file is None or self._pid != os.getpid():
            self._file, self._pid = self._open(), os.getpid()
        return self._file

    def close(self):
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None

    def __getstate__(self):  # picklable without the handle
        state = dict(self.__dict__)
        state["_file"] = None
        return state

    # -- reading -------------------------------------------------------------------
    def __len__(self):
        return self._len

    @property
    def cached(self):
        return self._cache is not None

    def __getitem__(self, index):
        """(x, y) NumPy arrays for an index array (any order, duplicates allowed)
        or a single integer."""
        if isinstance(index, (int, np.integer)):
            xb, yb = self[np.array([index])]
            return xb[0], (None if yb is None else yb[0])
        index = np.asarray(backend.asnumpy(index), dtype=np.int64)
        if index.size and (index.min() < -self._len or index.max() >= self._len):
            raise IndexError(f"index out of range for {self.path} with {self._len} samples: "
                             f"min {index.min()}, max {index.max()}")
        index = index % max(self._len, 1)
        if self._cache is not None:
            x, y = self._cache
            return x[index], (None if y is None else y[index])
        return self._read(index)

    def targets(self):
        """All labels, read without touching ``x`` (e.g. to count classes)."""
        if self.y_key is None:
            raise ValueError(f"HDF5 dataset {self.path} was opened without labels (y=None)")
        if self._cache is not None:
            return self._cache[1]
        return self._handle()[self.y_key][...]

    def _read(self, index):
        unique, inverse = np.unique(index, return_inverse=True)  # sorted, de-duplicated
        f = self._handle()
        try:
            x = _read_rows(f[self.x_key], unique)[inverse]
            y = None if self.y_key is None else _read_rows(f[self.y_key], unique)[inverse]
        except OSError as exc:
            raise OSError(f"cannot read {len(unique)} rows of HDF5 dataset {self.path} on "
                          f"rank {_rank()} (truncated or corrupt file?): {exc}") from exc
        return x, y


def _read_rows(ds, rows):
    """Rows (sorted, unique) of an h5py dataset in one read: the covering
    slice when the rows are dense in it (one contiguous read is faster than a
    point selection), else one fancy-indexed read."""
    if rows.size == 0:
        return np.empty((0,) + ds.shape[1:], ds.dtype)
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    if hi - lo <= 4 * rows.size:
        return ds[lo:hi][rows - lo]
    return ds[rows]
