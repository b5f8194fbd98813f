"""HDF5Dataset against direct h5py reads, its errors for bad files, and the
dataset writers (digits, IDX, synthetic, atomic write_hdf5). Serial: files are
written with h5py directly in tmp_path; the writers get a one-rank stand-in
communicator so that this process never initialises MPI (the fork test below
must not fork an MPI process)."""
import gzip
import os
import pickle
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

from spmdnet.utils.data import HDF5Dataset, datasets, hdf5

N = 500


class Solo:
    """A one-rank communicator for the writers (rank 0 writes, Barrier)."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def Barrier(self):
        pass


def write(path, n=N, layout="contiguous", y_len=None, extra=()):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 3, 4)).astype(np.float32)
    y = rng.integers(0, 10, n if y_len is None else y_len)
    kw = {"contiguous": {}, "chunked": {"chunks": (7, 3, 4)},
          "gzip": {"chunks": (16, 3, 4), "compression": "gzip"}}[layout]
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, **kw)
        f.create_dataset("y", data=y)
        for key in extra:
            f[key] = np.zeros(2)
    return str(path)


def direct(path, index, key):
    """What the dataset must return: one h5py read per sample."""
    with h5py.File(path, "r") as f:
        return np.stack([f[key][int(i)] for i in index]) if len(index) else f[key][:0]


class H5Path(str):
    """A file's path, and whether the dataset should memory-map it."""
    memory_map = True


@pytest.fixture(params=["contiguous", "contiguous-h5py", "chunked", "gzip"])
def h5file(request, tmp_path):
    path = H5Path(write(tmp_path / f"{request.param}.h5", layout=request.param.split("-")[0]))
    path.memory_map = not request.param.endswith("-h5py")
    return path


def index_arrays(rng):
    yield rng.integers(0, N, 64)                                   # sparse, duplicates
    yield rng.integers(-N, N, 40)                                  # negative ones too
    yield rng.permutation(np.arange(200, 264).repeat(2))[:100]     # dense, duplicates
    yield np.arange(N)[::-1]                                       # everything, reversed
    yield np.array([7, 7, 7])
    yield np.array([N - 1, 0])
    yield np.array([], dtype=np.int64)


@pytest.mark.parametrize("cache", [False, True])
def test_reads_equal_direct_h5py_reads(h5file, cache):
    ds = HDF5Dataset(h5file, memory_map=h5file.memory_map, cache=cache)
    assert ds.cached is cache
    assert len(ds) == N and ds.sample_shape == (3, 4) and ds.dtype == np.float32
    rng = np.random.default_rng(1)
    for index in index_arrays(rng):
        x, y = ds[index]
        np.testing.assert_array_equal(x, direct(h5file, index % N, "x"))
        np.testing.assert_array_equal(y, direct(h5file, index % N, "y"))
        assert x.shape == (len(index), 3, 4) and x.dtype == np.float32
    x, y = ds[[3, 1, 3]]  # a list works like an array
    np.testing.assert_array_equal(x, direct(h5file, [3, 1, 3], "x"))


def test_single_integer_index(h5file):
    ds = HDF5Dataset(h5file, memory_map=h5file.memory_map, cache=False)
    with h5py.File(h5file) as f:
        for i in (0, 17, N - 1, -1, np.int64(5)):
            x, y = ds[i]
            np.testing.assert_array_equal(x, f["x"][int(i) % N])
            assert y == f["y"][int(i) % N] and x.shape == (3, 4)


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("bad", [N, -N - 1, [0, N], [3, -N - 5], 10**9])
def test_out_of_range_index_raises(h5file, cache, bad):
    ds = HDF5Dataset(h5file, memory_map=h5file.memory_map, cache=cache)
    with pytest.raises(IndexError) as err:
        ds[bad]
    assert h5file in str(err.value) and f"{N} samples" in str(err.value)


def test_index_must_be_integers(h5file):
    ds = HDF5Dataset(h5file, memory_map=h5file.memory_map, cache=False)
    for bad in (np.array([1.5]), np.array([True, False]), np.zeros((2, 2), np.int64), "3"):
        with pytest.raises(TypeError, match="1-d array of integers"):
            ds[bad]
    assert ds[[]][0].shape == (0, 3, 4)
    np.testing.assert_array_equal(ds[np.array(4)][0], ds[4][0])
    np.testing.assert_array_equal(ds[np.array([2], np.uint8)][0], ds[[2]][0])


class Recorder:
    """Stands in for an h5py dataset and records how it was indexed."""

    def __init__(self, array):
        self.array, self.shape, self.dtype, self.calls = array, array.shape, array.dtype, []

    def __getitem__(self, key):
        self.calls.append("slice" if isinstance(key, slice) else "fancy")
        return self.array[key]


def test_dense_rows_read_as_one_covering_slice_sparse_ones_as_one_fancy_read():
    a = np.arange(1000 * 2).reshape(1000, 2)
    dense = np.unique(np.random.default_rng(0).integers(100, 300, 150))
    rec = Recorder(a)
    np.testing.assert_array_equal(hdf5._read_rows(rec, dense), a[dense])
    assert rec.calls == ["slice"]
    sparse = np.unique(np.random.default_rng(0).integers(0, 1000, 20))
    rec = Recorder(a)
    np.testing.assert_array_equal(hdf5._read_rows(rec, sparse), a[sparse])
    assert rec.calls == ["fancy"]
    rec = Recorder(a)
    assert hdf5._read_rows(rec, np.array([], np.int64)).shape == (0, 2) and rec.calls == []


def test_batch_is_one_sorted_deduplicated_read(h5file, monkeypatch):
    ds = HDF5Dataset(h5file, memory_map=False, cache=False)
    seen = []
    real = hdf5._read_rows

    def spy(dset, rows):
        seen.append(rows.copy())
        return real(dset, rows)

    monkeypatch.setattr(hdf5, "_read_rows", spy)
    ds[np.array([9, 2, 9, -1, 2, 400])]
    assert len(seen) == 2  # x once, y once
    for rows in seen:
        assert rows.tolist() == [2, 9, 400, N - 1]


def test_contiguous_datasets_are_memory_mapped(h5file, monkeypatch):
    ds = HDF5Dataset(h5file, memory_map=h5file.memory_map, cache=False)
    mapped = {"contiguous.h5": ["x", "y"], "chunked.h5": ["y"], "gzip.h5": ["y"]}
    want = mapped[os.path.basename(h5file)] if h5file.memory_map else []
    assert ds.memory_mapped == want
    calls, real = [], hdf5._read_rows

    def spy(dset, rows):
        calls.append(dset.name)
        return real(dset, rows)

    monkeypatch.setattr(hdf5, "_read_rows", spy)
    x, y = ds[np.array([5, 3, 5])]
    np.testing.assert_array_equal(x, direct(h5file, [5, 3, 5], "x"))
    np.testing.assert_array_equal(y, direct(h5file, [5, 3, 5], "y"))
    assert sorted(set(calls)) == sorted({"/x", "/y"} - {"/" + k for k in want})
    if want:
        x[...] = 0  # a batch is a copy, never a view of the file
        assert not np.array_equal(ds[np.array([5, 3, 5])][0], x)


def test_memory_map_placement_checks(tmp_path):
    """A user block shifts the data; a dataset never written has no storage
    (h5py returns its fill value); big-endian data keeps its dtype; all read
    the same as h5py."""
    path = tmp_path / "ub.h5"
    x = np.arange(60, dtype=">f4").reshape(20, 3)
    with h5py.File(path, "w", userblock_size=1024) as f:
        f["x"] = x
        f.create_dataset("y", (20,), np.int64, fillvalue=7)
    ds = HDF5Dataset(path, cache=False)
    assert ds.memory_mapped == ["x"]
    xb, yb = ds[np.array([19, 0, 4])]
    np.testing.assert_array_equal(xb, x[[19, 0, 4]])
    assert xb.dtype == np.dtype(">f4") and yb.tolist() == [7, 7, 7]
    np.testing.assert_array_equal(ds.targets(), np.full(20, 7))
    nan = tmp_path / "nan.h5"
    with h5py.File(nan, "w") as f:
        f["x"] = np.full((4, 2), np.nan, np.float32)
        f["y"] = np.arange(4)
    ds = HDF5Dataset(nan, cache=False, allow_nonfinite=True)  # NaN on purpose
    assert ds.memory_mapped == ["x", "y"] and np.isnan(ds[[3, 0]][0]).all()


def test_file_opened_read_only_with_small_sieve_buffer(h5file):
    ds = HDF5Dataset(h5file, memory_map=h5file.memory_map, cache=False)
    f = ds._handle()
    assert f.mode == "r"
    assert f.id.get_access_plist().get_sieve_buf_size() == hdf5.SIEVE_BYTES
    assert ds._handle() is f  # one handle per process, reused
    ds.close()
    assert ds._file is None
    np.testing.assert_array_equal(ds[[1]][0], direct(h5file, [1], "x"))  # reopened


@pytest.mark.parametrize("locking", [False, True, "best-effort"])
def test_locking_option(h5file, locking):
    ds = HDF5Dataset(h5file, memory_map=h5file.memory_map, cache=False, locking=locking)
    x, _ = ds[np.array([3, 1])]
    ds.close()  # HDF5 refuses a second open of the file with other locking flags
    np.testing.assert_array_equal(x, direct(h5file, [3, 1], "x"))


def test_no_labels_and_targets(h5file):
    for cache in (False, True):
        ds = HDF5Dataset(h5file, memory_map=h5file.memory_map, cache=cache)
        np.testing.assert_array_equal(ds.targets(), direct(h5file, range(N), "y"))
        ds = HDF5Dataset(h5file, memory_map=h5file.memory_map, y=None, cache=cache)
        x, y = ds[np.array([4, 2])]
        assert y is None and x.shape == (2, 3, 4)
        with pytest.raises(ValueError, match="without labels"):
            ds.targets()


def test_cache_auto_follows_the_memory_budget(h5file):
    assert HDF5Dataset(h5file).cached  # 30 KB, under the default budget
    assert not HDF5Dataset(h5file, memory_map=h5file.memory_map, cache_bytes=1000).cached
    with pytest.raises(ValueError, match="cache must be"):
        HDF5Dataset(h5file, memory_map=h5file.memory_map, cache="yes")
    with pytest.raises(ValueError, match="locking must be"):
        HDF5Dataset(h5file, memory_map=h5file.memory_map, locking="maybe")


# -- bad inputs ---------------------------------------------------------------------

def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nowhere" / "train.h5"
    with pytest.raises(FileNotFoundError) as err:
        HDF5Dataset(path)
    assert str(path) in str(err.value)


def test_missing_key_lists_the_keys_present(tmp_path):
    path = write(tmp_path / "k.h5", extra=("labels_v2",))
    for kw, missing in (({"x": "images"}, "images"), ({"y": "labels"}, "labels")):
        with pytest.raises(KeyError) as err:
            HDF5Dataset(path, **kw)
        msg = str(err.value)
        assert path in msg and repr(missing) in msg
        assert "'labels_v2'" in msg and "'x'" in msg and "'y'" in msg


def test_key_that_is_not_an_array_of_samples(tmp_path):
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f.create_group("x")
        f["y"] = np.zeros(3)
        f["s"] = 1.0
    with pytest.raises(ValueError, match="'x' is not an array"):
        HDF5Dataset(path)
    with pytest.raises(ValueError, match="'s' is not an array"):
        HDF5Dataset(path, x="s", y=None)


def test_length_mismatch_shows_both_lengths(tmp_path):
    path = write(tmp_path / "m.h5", n=50, y_len=49)
    with pytest.raises(ValueError) as err:
        HDF5Dataset(path)
    msg = str(err.value)
    assert path in msg and "50" in msg and "49" in msg and "'x'" in msg and "'y'" in msg


def h5py_message(path):
    try:
        h5py.File(path, "r")
    except OSError as exc:
        return str(exc)
    raise AssertionError(f"h5py opened {path}")


def test_truncated_file_names_path_and_keeps_h5py_message(tmp_path):
    path = write(tmp_path / "t.h5")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(OSError) as err:
        HDF5Dataset(path)
    msg = str(err.value)
    assert path in msg and "rank" in msg and "truncated file" in msg
    assert h5py_message(path) in msg


def test_file_that_is_not_hdf5(tmp_path):
    path = tmp_path / "notes.h5"
    path.write_text("not an HDF5 file\n" * 20)
    with pytest.raises(OSError) as err:
        HDF5Dataset(path)
    assert str(path) in str(err.value) and h5py_message(path) in str(err.value)


def test_corrupt_data_found_at_read_time_names_the_path(tmp_path):
    path = write(tmp_path / "z.h5", layout="gzip")
    with h5py.File(path) as f:
        info = f["x"].id.get_chunk_info(3)
    with open(path, "r+b") as f:  # garble one compressed chunk
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    ds = HDF5Dataset(path, cache=False)  # the metadata is intact
    ds[np.arange(0, 16)]  # an intact chunk reads fine
    with pytest.raises(OSError) as err:
        ds[np.arange(3 * 16, 4 * 16)]
    assert path in str(err.value) and "corrupt" in str(err.value)


# -- processes ----------------------------------------------------------------------

def test_pickle_round_trip_drops_the_handle_and_reads_the_same(h5file):
    ds = HDF5Dataset(h5file, memory_map=h5file.memory_map, cache=False)
    index = np.array([5, 1, 5, 300])
    before = ds[index]
    assert ds._file is not None
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._file is None
    after = clone[index]
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])


def test_handle_reopened_in_a_forked_child(tmp_path):
    """Fork in a fresh interpreter (this test process may have MPI up): the
    child must not reuse the parent's h5py handle, and reads the same data."""
    path = write(tmp_path / "f.h5")
    script = textwrap.dedent(f"""
        import os, sys
        import numpy as np
        from spmdnet.data import HDF5Dataset
        ds = HDF5Dataset({path!r}, cache=False)
        index = np.array([9, 3, 9, 499, 0])
        parent_x, parent_y = ds[index]
        parent_handle = ds._file
        pid = os.fork()
        if pid == 0:
            try:
                x, y = ds[index]
                ok = (ds._file is not parent_handle and ds._pid == os.getpid()
                      and np.array_equal(x, parent_x) and np.array_equal(y, parent_y))
            except BaseException as exc:
                print("child failed:", exc, file=sys.stderr, flush=True)
                ok = False
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0, status
        x, _ = ds[index]  # the parent's handle still works
        assert np.array_equal(x, parent_x) and ds._file is parent_handle
        print("fork ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "fork ok" in proc.stdout, proc.stderr


# -- writers ------------------------------------------------------------------------

def test_make_digits_writes_the_1797_uci_digits(tmp_path):
    train, test = datasets.make_digits(tmp_path, comm=Solo())
    tr, te = HDF5Dataset(train), HDF5Dataset(test)
    assert len(tr) + len(te) == 1797 and len(te) == 359
    for ds in (tr, te):
        x, y = ds[np.arange(len(ds))]
        assert x.dtype == np.float32 and x.shape[1:] == (64,)
        assert 0.0 <= x.min() and x.max() <= 1.0 and x.max() == 1.0
        assert y.dtype == np.int64 and set(np.unique(y)) == set(range(10))
    assert sorted(os.listdir(tmp_path)) == ["digits_test.h5", "digits_train.h5"]
    # seeded: the same split again
    again = datasets.make_digits(tmp_path / "again", comm=Solo())
    np.testing.assert_array_equal(HDF5Dataset(again[1]).targets(), te.targets())


def idx_bytes(array, type_code=0x08):
    header = bytes([0, 0, type_code, array.ndim])
    dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + dims + array.tobytes()


@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_and_make_mnist(tmp_path, gz):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 4, 5), dtype=np.uint8)
    labels = rng.integers(0, 10, 6).astype(np.uint8)
    suffix = ".gz" if gz else ""
    opener = gzip.open if gz else open
    ipath, lpath = tmp_path / f"images-idx3-ubyte{suffix}", tmp_path / f"labels-idx1{suffix}"
    with opener(ipath, "wb") as f:
        f.write(idx_bytes(images))
    with opener(lpath, "wb") as f:
        f.write(idx_bytes(labels))
    np.testing.assert_array_equal(datasets.read_idx(ipath), images)
    np.testing.assert_array_equal(datasets.read_idx(lpath), labels)
    big_endian = np.arange(6, dtype=">i4").reshape(2, 3)
    (tmp_path / "i4.idx").write_bytes(idx_bytes(big_endian, 0x0C))
    np.testing.assert_array_equal(datasets.read_idx(tmp_path / "i4.idx"), big_endian)

    out = datasets.make_mnist(ipath, lpath, tmp_path / "mnist.h5", comm=Solo())
    x, y = HDF5Dataset(out)[np.arange(6)]
    np.testing.assert_allclose(x, images[:, None] / 255.0, rtol=1e-6)  # (N, 1, H, W)
    assert x.dtype == np.float32 and y.dtype == np.int64 and y.tolist() == labels.tolist()


def test_read_idx_errors(tmp_path):
    good = idx_bytes(np.zeros((3, 2, 2), np.uint8))
    cases = {
        "magic.idx": (b"\x12\x34" + good[2:], "not an IDX file"),
        "empty.idx": (b"", "not an IDX file"),
        "type.idx": (good[:2] + b"\x07" + good[3:], "unknown IDX element type 0x07"),
        "data.idx": (good[:-3], "truncated"),
        "header.idx": (good[:9], "truncated"),
        "long.idx": (good + b"\0", "bytes after the header"),
    }
    for name, (raw, message) in cases.items():
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(ValueError, match=message) as err:
            datasets.read_idx(tmp_path / name)
        assert name in str(err.value)
    gz = tmp_path / "cut.idx.gz"
    gz.write_bytes(gzip.compress(good)[:-12])
    with pytest.raises(ValueError, match="truncated") as err:
        datasets.read_idx(gz)
    assert "cut.idx.gz" in str(err.value)
    with pytest.raises(ValueError, match="has 3 images but .* has 2 labels"):
        (tmp_path / "l.idx").write_bytes(idx_bytes(np.zeros(2, np.uint8)))
        (tmp_path / "i.idx").write_bytes(good)
        datasets.make_mnist(tmp_path / "i.idx", tmp_path / "l.idx", tmp_path / "o.h5",
                            comm=Solo())


def test_write_hdf5_is_atomic(tmp_path):
    x, y = np.ones((10, 3), np.float32), np.arange(10)
    path = datasets.write_hdf5(tmp_path / "sub" / "d.h5", x, y, comm=Solo())
    assert os.listdir(tmp_path / "sub") == ["d.h5"]  # no temporary file left behind
    np.testing.assert_array_equal(HDF5Dataset(path)[np.arange(10)][0], x)

    # a failure while writing leaves nothing under the final name, and no temporary
    with pytest.raises(TypeError):
        datasets.write_hdf5(tmp_path / "bad.h5", x, np.array([object()] * 10), comm=Solo())
    assert sorted(os.listdir(tmp_path)) == ["sub"]
    # ... and leaves an existing file under that name intact
    with pytest.raises(TypeError):
        datasets.write_hdf5(path, x * 2, np.array([object()] * 10), comm=Solo())
    assert os.listdir(tmp_path / "sub") == ["d.h5"]
    np.testing.assert_array_equal(HDF5Dataset(path)[np.arange(10)][0], x)


def test_write_hdf5_chunk_rows(tmp_path):
    x = np.zeros((100, 4), np.float32)
    path = datasets.write_hdf5(tmp_path / "c.h5", x, np.zeros(100), comm=Solo(),
                               chunk_rows=8)
    with h5py.File(path) as f:
        assert f["x"].chunks == (8, 4)


def test_make_synthetic_is_contiguous_and_one_problem_across_seeds(tmp_path):
    train = datasets.make_synthetic(tmp_path / "tr.h5", 3000, features=64, seed=1,
                                    comm=Solo())
    test = datasets.make_synthetic(tmp_path / "te.h5", 1000, features=64, seed=2,
                                   comm=Solo())
    with h5py.File(train) as f:
        assert f["x"].chunks is None and f["x"].shape == (3000, 64)
        assert f["x"].dtype == np.float32 and f["y"].dtype == np.int64
    xtr, ytr = HDF5Dataset(train)[np.arange(3000)]
    xte, yte = HDF5Dataset(test)[np.arange(1000)]
    x, y = datasets.synthetic(1000, features=64, seed=2)
    np.testing.assert_array_equal(x, xte)  # the file holds synthetic(n, ...) samples
    np.testing.assert_array_equal(y, yte)
    assert not np.array_equal(xtr[:1000], xte)
    # a nearest-class-mean classifier fit on one seed's samples classifies the other's
    means = np.stack([xtr[ytr == c].mean(0) for c in range(10)])
    pred = ((xte[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == yte).mean() > 0.9
