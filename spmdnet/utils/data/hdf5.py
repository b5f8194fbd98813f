"""HDF5Dataset: batches read from an HDF5 file, one read per batch.

The file is opened lazily, read-only, by each process on first access and
reopened after a fork (an h5py handle must never cross a fork). Validation
happens at construction, so a bad path, key or length fails before training
with the path in the message. ``ds[indices]`` reads a whole batch at once,
never sample by sample, in one of two ways:

* a dataset stored contiguous and unfiltered (what the writers in
  ``datasets`` produce) is read through a read-only memory map of its bytes
  in the file (located with h5py, checked against h5py's own read at open):
  one NumPy fancy index per batch, in the requested order. h5py spends about
  3 us per row of a sparse selection, a PyTorch-style per-sample reader about
  10 us per sample; the map copies a 3 KB row in well under 1 us once the
  page cache holds it (benchmarks/loader.py). ``memory_map=False`` turns it
  off. Rewrite a file only by writing a new file and renaming it over the
  old one (as ``datasets`` does): a running job keeps reading the old one.
  A file changed in place is an error: before every uncached read, the open
  file's size and modification time are compared with those it had when
  this process opened it (one ``fstat`` per batch, 2-4 us measured), and a
  change raises OSError naming the file, instead of reading through a map
  of a truncated file (SIGBUS: the process dies, no file named) or reading
  torn data. Only a change within a batch's read itself is not caught.
* any other dataset (chunked, compressed, external) is read with one h5py
  read of the sorted, de-duplicated indices (the covering slice when they are
  dense), then put back in the requested order. Such files are opened with a
  small HDF5 sieve buffer (``SIEVE_BYTES``): HDF5's default of 64 KiB loads
  64 KiB for every row of a sparse selection. Chunks should hold few rows: a
  read touches whole chunks, so chunks of hundreds of rows read hundreds of
  rows per sample.
"""
import errno
import mmap
import os

import numpy as np

from ... import backend
from ...distributed import rank_label

NUMERIC_KINDS = "biuf"  # dtype kinds a dataset may hold: bool, int, uint, float
SIEVE_BYTES = 4096  # HDF5's data sieve buffer per open file (default 64 KiB); see above


def _h5py():
    import h5py  # noqa: PLC0415 - 0.1 s to import: on first use only
    return h5py


class HDF5Dataset:
    """Samples ``x[i]`` (and labels ``y[i]``) of datasets in an HDF5 file.

    ``locking`` is h5py's file-locking option (None: HDF5's default; True,
    False, or "best-effort"; False helps on shared filesystems without lock
    support); ``cache`` is True, False or "auto" (load the whole file
    into memory when it is at most ``cache_bytes``); ``memory_map`` reads
    contiguous datasets through a read-only memory map (see the module's
    notes).

    Float samples and labels are checked for NaN and infinity (a NaN in
    the data trains the model to NaN, and only a later checkpoint would name
    a parameter, never the file): the whole dataset when it is cached, else
    each row at its first read in the process. A ValueError names the file,
    the key and the first bad row. ``allow_nonfinite=True`` skips the check,
    for data that holds NaN on purpose (missing values masked later).
    """

    def __init__(self, path, x="x", y="y", locking=None, cache="auto",
                 cache_bytes=256 * 2**20, memory_map=True, allow_nonfinite=False):
        self.path, self.x_key, self.y_key = str(path), x, y
        if locking not in (None, True, False, "best-effort"):
            raise ValueError(f"locking must be None, True, False or 'best-effort', got "
                             f"{locking!r}")
        if cache not in (True, False, "auto"):
            raise ValueError(f"cache must be True, False or 'auto', got {cache!r}")
        self.locking, self.memory_map = locking, bool(memory_map)
        self.allow_nonfinite = bool(allow_nonfinite)
        self._file, self._pid, self._cache, self._sources = None, None, None, {}
        self._watched, self._stamp = None, None  # the open file watched for changes
        f = self._open()
        try:
            self._validate(f)
            nbytes = f[x].size * f[x].dtype.itemsize + (f[y].size * f[y].dtype.itemsize
                                                         if y else 0)
            if cache is True or (cache == "auto" and nbytes <= cache_bytes):
                self._cache = (self._read_whole(f, x), self._read_whole(f, y) if y else None)
        finally:
            f.close()  # reopened per process at first read
        self._checked = None  # rows found finite in this process (uncached reads)
        if self._cache is not None:
            everything = np.arange(self._len)
            for key, values in zip((x, y), self._cache):
                self._check_finite(key, values, everything)

    def _read_whole(self, f, key):
        """A whole dataset into memory (``cache``), a read error naming the
        file, the key and the rank: a corrupt chunk fails here, at open."""
        try:
            return f[key][...]
        except OSError as exc:
            raise OSError(f"cannot read {key!r} of HDF5 dataset {self.path} into memory on "
                          f"rank {rank_label()} (truncated or corrupt file?): {exc}") from exc

    def _check_finite(self, key, values, rows):
        """Raise ValueError naming the first row of ``values`` (rows ``rows``
        of ``key``) holding NaN or infinity; float data only."""
        if self.allow_nonfinite or values is None or values.dtype.kind != "f":
            return
        bad = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
        if bad.any():
            first = int(np.min(rows[bad]))
            raise ValueError(f"HDF5 dataset {self.path}: {key!r} holds NaN or infinity, first "
                             f"in row {first} (rank {rank_label()}); fix the data, or pass "
                             "allow_nonfinite=True where non-finite values are meant")

    # -- file handling -------------------------------------------------------------
    def _open(self):
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"HDF5 dataset {self.path} does not exist "
                                    f"(rank {rank_label()})")
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
            raise OSError(f"cannot open HDF5 dataset {self.path} on rank {rank_label()}: "
                          f"{exc}") from exc

    def _validate(self, f):
        """Keys, kinds, lengths and dtypes, checked at open time (the rank in
        every message): strings or an empty file must not reach training."""
        keys = sorted(f.keys())
        where = f"HDF5 dataset {self.path} (rank {rank_label()})"
        for key in (self.x_key, self.y_key):
            if key is not None and key not in f:
                raise KeyError(f"{where} has no key {key!r}; keys present: {keys}")
            if key is not None and (not isinstance(f[key], _h5py().Dataset) or f[key].ndim < 1):
                raise ValueError(f"{where}: {key!r} is not an array of samples ({f[key]})")
            if key is not None and f[key].dtype.kind not in NUMERIC_KINDS:
                raise TypeError(f"{where}: {key!r} holds {f[key].dtype} values; samples and "
                                "labels must be numbers (bool, integer or float)")
        if self.y_key is not None and len(f[self.x_key]) != len(f[self.y_key]):
            raise ValueError(f"{where}: {self.x_key!r} has {len(f[self.x_key])} samples but "
                             f"{self.y_key!r} has {len(f[self.y_key])}")
        if len(f[self.x_key]) == 0:
            raise ValueError(f"{where}: {self.x_key!r} holds no samples (shape "
                             f"{f[self.x_key].shape})")
        self._len = len(f[self.x_key])
        self.sample_shape = f[self.x_key].shape[1:]
        self.label_shape = f[self.y_key].shape[1:] if self.y_key is not None else None
        self.dtype = f[self.x_key].dtype

    def _handle(self):
        """This process's open file (reopened in a forked child)."""
        if self._file is None or self._pid != os.getpid():
            # the file watched for changes, kept open (closed with the dataset):
            # opened before the HDF5 file, so a change between the two is seen
            # at the first read
            watched = open(self.path, "rb", buffering=0)  # noqa: SIM115 - see above
            stamp = _stamp(os.fstat(watched.fileno()))
            self._file, self._pid = self._open(), os.getpid()
            self._watched, self._stamp = watched, stamp
            self._sources = {key: _source(self._file[key], self.path, self.memory_map)
                             for key in (self.x_key, self.y_key) if key is not None}
        else:
            self._check_unchanged()
        return self._file

    def _check_unchanged(self):
        """OSError naming the file when it changed in place since this
        process opened it (see the module's notes)."""
        now = _stamp(os.fstat(self._watched.fileno()))
        if now != self._stamp:
            raise OSError(errno.ESTALE, (
                f"HDF5 dataset {self.path} changed on disk while this job reads it (rank "
                f"{rank_label()}): {self._stamp[0]} bytes modified at {self._stamp[1]} ns "
                f"when opened, now {now[0]} bytes modified at {now[1]} ns. Rewriting a "
                "dataset in place under a running job gives it torn data (or kills it, "
                "through the memory map); write the new file next to it and rename it over "
                "the old one, which a running job keeps reading"))

    @property
    def memory_mapped(self):
        """The keys read through a memory map in this process."""
        self._handle()
        return sorted(key for key, src in self._sources.items() if isinstance(src, np.ndarray))

    def close(self):
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
            self._watched.close()
        self._file, self._sources, self._watched = None, {}, None

    def __getstate__(self):  # picklable without the handle, the descriptor and the maps
        state = dict(self.__dict__)
        state["_file"], state["_sources"], state["_watched"] = None, {}, None
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
        index = np.asarray(backend.asnumpy(index))
        if index.ndim == 0 and index.dtype.kind in "iu":
            return self[int(index)]
        if index.ndim != 1 or (index.dtype.kind not in "iu" and index.size):
            raise TypeError(f"index {self.path} with an integer, or a 1-d array of integers; "
                            f"got a {index.ndim}-d {index.dtype} array")
        index = index.astype(np.int64, copy=False)
        if index.size:
            lo, hi = index.min(), index.max()
            if lo < -self._len or hi >= self._len:
                raise IndexError(f"index out of range for {self.path} with {self._len} "
                                 f"samples: min {lo}, max {hi}")
            if lo < 0:
                index = index % self._len
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
        self._handle()
        return np.array(self._sources[self.y_key][...])

    def _read(self, index):
        self._handle()
        order = _Order(index)
        try:
            x = _rows(self._sources[self.x_key], index, order)
            y = None if self.y_key is None else _rows(self._sources[self.y_key], index, order)
        except OSError as exc:
            raise OSError(f"cannot read {len(index)} rows of HDF5 dataset {self.path} on "
                          f"rank {rank_label()} (truncated or corrupt file?): {exc}") from exc
        if not self.allow_nonfinite and (x.dtype.kind == "f" or (y is not None
                                                                  and y.dtype.kind == "f")):
            self._check_new_rows(index, x, y)
        return x, y

    def _check_new_rows(self, index, x, y):
        """The finite check of rows read for the first time in this process:
        each row once, whatever the epochs and the order."""
        if self._checked is None:
            self._checked = np.zeros(self._len, bool)
        new = ~self._checked[index]
        if new.any():
            self._check_finite(self.x_key, x[new], index[new])
            self._check_finite(self.y_key, None if y is None else y[new], index[new])
            self._checked[index[new]] = True


def check_same_features(first, second):
    """Raise ValueError naming both files unless two datasets (a training and
    a test set) hold samples of the same shape, and labels of the same shape
    where both have labels. Called when both are opened, a test file with the
    wrong feature count fails before the first step, not after an epoch.
    Takes HDF5Datasets or in-memory ArrayDatasets."""
    (a, ax, ay), (b, bx, by) = _shapes(first), _shapes(second)
    if ax != bx or (ay is not None and by is not None and ay != by):
        raise ValueError(f"datasets disagree (rank {rank_label()}): {a} holds samples of shape "
                         f"{ax} and labels of shape {ay}, {b} holds samples of shape {bx} and "
                         f"labels of shape {by}")


def _shapes(ds):
    """(name, sample shape, label shape or None) of a dataset."""
    if isinstance(ds, HDF5Dataset):
        return (f"{ds.path} (keys {ds.x_key!r}, {ds.y_key!r})", tuple(ds.sample_shape),
                None if ds.label_shape is None else tuple(ds.label_shape))
    y = getattr(ds, "y", None)
    return (f"an in-memory {type(ds).__name__}", tuple(np.shape(ds.x)[1:]),
            None if y is None else tuple(np.shape(y)[1:]))


class _Order:
    """The sorted, de-duplicated form of an index array, computed once per
    batch for all h5py-read keys; ``restore`` is None when it is the index."""

    def __init__(self, index):
        self.index, self._unique = index, None

    def unique(self):
        if self._unique is None:
            self._unique, inverse = np.unique(self.index, return_inverse=True)
            same = len(self._unique) == len(self.index) and np.array_equal(self._unique,
                                                                             self.index)
            self.restore = None if same else inverse
        return self._unique


def _rows(source, index, order):
    if isinstance(source, np.ndarray):  # a memory map: one fancy index, in order
        return source[index]
    rows = _read_rows(source, order.unique())
    return rows if order.restore is None else rows[order.restore]


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


def _stamp(st):
    """(size, modification time in ns) of an ``os.stat_result``: what an
    in-place rewrite changes."""
    return st.st_size, st.st_mtime_ns


def _source(dset, path, memory_map):
    """What rows of ``dset`` are read from: a read-only array over its bytes in
    the file when it is stored contiguous, unfiltered and allocated, else the
    h5py dataset itself."""
    if not memory_map or dset.size == 0:
        return dset
    h5d = _h5py().h5d
    plist = dset.id.get_create_plist()
    if (plist.get_layout() != h5d.CONTIGUOUS or plist.get_nfilters()
            or plist.get_external_count()):
        return dset
    nbytes = dset.size * dset.dtype.itemsize
    offset = dset.id.get_offset()
    if (offset is None or dset.id.get_storage_size() < nbytes or dset.dtype.hasobject
            or offset + nbytes > os.path.getsize(path)):
        return dset
    try:
        with open(path, "rb") as fh:
            mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # a filesystem without mmap: read through h5py
        return dset
    if hasattr(mmap, "MADV_RANDOM"):
        mapping.madvise(mmap.MADV_RANDOM)  # shuffled rows: no read-ahead around each
    array = np.frombuffer(mapping, dset.dtype, dset.size, offset).reshape(dset.shape)
    for row in (0, len(dset) - 1):  # the bytes h5py reads (NaN-safe comparison)
        if array[row].tobytes() != np.asarray(dset[row]).tobytes():
            return dset  # not where h5py says: read through h5py
    return array
