"""DataLoader: batches in the sampler's order with the dataset's content,
drop_last and len, prefetching that changes nothing but timing, errors raised
in the training loop, no thread left behind, and the wait-time counter."""
import threading
import time

import h5py
import numpy as np
import pytest

from spmdnet.data import DataLoader, DistributedSampler, HDF5Dataset


class ArrayDataset:
    """ds[index] -> (x[index], y[index]); optionally slow or failing."""

    def __init__(self, n=103, delay=0.0, fail_at=None):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, 3)).astype(np.float32)
        self.y = np.arange(n) * 10
        self.delay, self.fail_at, self.reads = delay, fail_at, 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        self.reads += 1
        if self.fail_at is not None and self.reads > self.fail_at:
            raise RuntimeError(f"read {self.reads} failed")
        if self.delay:
            time.sleep(self.delay)
        return self.x[index], self.y[index]


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "spmdnet-prefetch"]


@pytest.fixture
def h5ds(tmp_path):
    rng = np.random.default_rng(3)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["x"] = rng.standard_normal((103, 2, 3)).astype(np.float32)
        f["y"] = rng.integers(0, 5, 103)
    return HDF5Dataset(tmp_path / "d.h5", cache=False)


@pytest.mark.parametrize("prefetch", [0, 1, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_equal_reading_the_sampler_indices(h5ds, prefetch, drop_last):
    for rank in range(3):
        sampler = DistributedSampler(h5ds, num_replicas=3, rank=rank, seed=5)
        sampler.set_epoch(2)
        loader = DataLoader(h5ds, 8, sampler=sampler, drop_last=drop_last,
                            prefetch=prefetch, device="cpu")
        idx = sampler.indices()  # 35 per rank
        stop = 32 if drop_last else 35
        batches = list(loader)
        assert len(batches) == len(loader) == (4 if drop_last else 5)
        assert [len(y) for _, y in batches] == [8] * 4 + ([] if drop_last else [3])
        with h5py.File(h5ds.path) as f:
            want_x = np.stack([f["x"][i] for i in idx[:stop]])
            want_y = np.array([f["y"][i] for i in idx[:stop]])
        np.testing.assert_array_equal(np.concatenate([x for x, _ in batches]), want_x)
        np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), want_y)
        for k, (x, y) in enumerate(batches):
            ref = h5ds[idx[8 * k:8 * k + 8]]
            np.testing.assert_array_equal(x, ref[0])
            np.testing.assert_array_equal(y, ref[1])
            assert isinstance(x, np.ndarray)


def test_prefetch_does_not_change_results():
    ds = ArrayDataset()
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, seed=1)
    runs = []
    for prefetch in (0, 3):
        loader = DataLoader(ds, 7, sampler=sampler, prefetch=prefetch, device="cpu")
        epochs = []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            epochs.append(list(loader))
        runs.append(epochs)
    for e0, e3 in zip(*runs):
        assert len(e0) == len(e3) == 8
        for (x0, y0), (x3, y3) in zip(e0, e3):
            np.testing.assert_array_equal(x0, x3)
            np.testing.assert_array_equal(y0, y3)
    assert not np.array_equal(runs[0][0][0][1], runs[0][1][0][1])  # epochs reshuffle


def test_without_sampler_every_index_in_order_and_plain_iterable_samplers():
    ds = ArrayDataset(n=10)
    assert [y.tolist() for _, y in DataLoader(ds, 4, device="cpu")] == \
        [[0, 10, 20, 30], [40, 50, 60, 70], [80, 90]]
    assert len(DataLoader(ds, 4)) == 3 and len(DataLoader(ds, 4, drop_last=True)) == 2
    loader = DataLoader(ds, 2, sampler=[9, 0, 9], device="cpu")  # any iterable of indices
    assert [y.tolist() for _, y in loader] == [[90, 0], [90]]
    assert len(loader) == 2


@pytest.mark.parametrize("n,batch,drop_last,expected",
                         [(0, 4, False, 0), (0, 4, True, 0), (3, 4, False, 1), (3, 4, True, 0),
                          (8, 4, False, 2), (8, 4, True, 2), (9, 4, False, 3), (9, 4, True, 2)])
def test_len_matches_batches_iterated(n, batch, drop_last, expected):
    ds = ArrayDataset(n=n)
    loader = DataLoader(ds, batch, drop_last=drop_last, device="cpu")
    assert len(loader) == expected == len(list(loader)) == len(loader.batches())


def test_len_follows_the_sampler_start_index():
    ds = ArrayDataset(n=100)
    sampler = DistributedSampler(ds, num_replicas=4, rank=0)
    loader = DataLoader(ds, 5, sampler=sampler, device="cpu")
    assert len(loader) == 5
    sampler.set_start_index(10)
    batches = list(loader)
    assert len(loader) == len(batches) == 3
    np.testing.assert_array_equal(batches[0][1], ds.y[sampler.indices()[:5]])


@pytest.mark.parametrize("prefetch", [0, 2])
def test_exception_in_dataset_read_reaches_the_training_loop(prefetch):
    baseline = threading.active_count()
    ds = ArrayDataset(fail_at=3)
    loader = DataLoader(ds, 10, prefetch=prefetch, device="cpu")
    got = []
    with pytest.raises(RuntimeError, match="read 4 failed"):
        for x, _ in loader:
            got.append(x)
    assert len(got) == 3  # the batches before the failure arrived
    assert not prefetch_threads() and threading.active_count() == baseline


@pytest.mark.parametrize("prefetch", [1, 2, 5])
def test_breaking_out_early_leaves_no_thread(prefetch):
    baseline = threading.active_count()
    ds = ArrayDataset(n=1000, delay=0.001)
    loader = DataLoader(ds, 3, prefetch=prefetch, device="cpu")
    for k, _ in enumerate(loader):
        if k == 2:
            assert prefetch_threads()  # the reader runs ahead ...
            time.sleep(0.02)  # ... and fills the queue, then waits on it
            break
    assert not prefetch_threads() and threading.active_count() == baseline
    assert ds.reads <= 3 + prefetch + 1  # it stopped reading too
    it = iter(loader)  # an abandoned iterator is cleaned up when closed
    next(it)
    it.close()
    assert threading.active_count() == baseline


def test_dataset_in_memory_is_read_inline(h5ds):
    cached = HDF5Dataset(h5ds.path, cache=True)
    sampler = DistributedSampler(cached, num_replicas=2, rank=1, seed=2)
    inline = DataLoader(cached, 10, sampler=sampler, prefetch=2, device="cpu")
    threaded = DataLoader(h5ds, 10, sampler=sampler, prefetch=2, device="cpu")
    for (xa, ya), (xb, yb) in zip(inline, threaded, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    for _ in inline:
        assert not prefetch_threads()  # no thread for a fancy index into memory
    for _ in threaded:
        assert prefetch_threads()
        break


def test_thread_ends_after_a_full_epoch():
    baseline = threading.active_count()
    loader = DataLoader(ArrayDataset(), 10, device="cpu")
    for _ in range(2):
        assert len(list(loader)) == 11
        assert threading.active_count() == baseline


@pytest.mark.parametrize("prefetch", [0, 2])
def test_wait_s_grows(prefetch):
    ds = ArrayDataset(n=40, delay=0.005)
    loader = DataLoader(ds, 10, prefetch=prefetch, device="cpu")
    assert loader.wait_s == 0.0
    list(loader)
    first = loader.wait_s
    assert first >= 0.005  # at least the first read was waited for
    list(loader)
    assert loader.wait_s > first  # accumulates over epochs


def test_argument_validation():
    ds = ArrayDataset()
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        DataLoader(ds, 0)
    with pytest.raises(ValueError, match="prefetch must be non-negative, got -1"):
        DataLoader(ds, 4, prefetch=-1)
