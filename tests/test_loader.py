"""DataLoader: batches in the sampler's order with the dataset's content,
drop_last and len, prefetching that changes nothing but timing, errors raised
in the training loop, no thread left behind, the wait-time counter, and
resuming mid-epoch from state_dict() exactly where an uninterrupted run goes on."""
import json
import threading
import time

import h5py
import numpy as np
import pytest

from spmdnet import Tensor
from spmdnet.data import ArrayDataset, DataLoader, DistributedSampler, HDF5Dataset


class Instrumented(ArrayDataset):
    """spmdnet's ArrayDataset (x random, y = 10 * index) that counts its reads
    and is optionally slow, or fails from a given read on."""

    def __init__(self, n=103, delay=0.0, fail_at=None):
        rng = np.random.default_rng(0)
        super().__init__(rng.standard_normal((n, 3)).astype(np.float32), np.arange(n) * 10)
        self.delay, self.fail_at, self.reads = delay, fail_at, 0

    def __getitem__(self, index):
        self.reads += 1
        if self.fail_at is not None and self.reads > self.fail_at:
            raise RuntimeError(f"read {self.reads} failed")
        if self.delay:
            time.sleep(self.delay)
        return super().__getitem__(index)


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
            # PyTorch's batches: Tensors (here over host arrays, device="cpu")
            assert isinstance(x, Tensor) and isinstance(x.array, np.ndarray)


def test_prefetch_does_not_change_results():
    ds = Instrumented()
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
    ds = Instrumented(n=10)
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
    ds = Instrumented(n=n)
    loader = DataLoader(ds, batch, drop_last=drop_last, device="cpu")
    assert len(loader) == expected == len(list(loader)) == len(loader.batches())


def test_len_follows_the_sampler_start_index():
    ds = Instrumented(n=100)
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
    ds = Instrumented(fail_at=3)
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
    ds = Instrumented(n=1000, delay=0.001)
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
    loader = DataLoader(Instrumented(), 10, device="cpu")
    for _ in range(2):
        assert len(list(loader)) == 11
        assert threading.active_count() == baseline


@pytest.mark.parametrize("prefetch", [0, 2])
def test_wait_s_grows(prefetch):
    ds = Instrumented(n=40, delay=0.005)
    loader = DataLoader(ds, 10, prefetch=prefetch, device="cpu")
    assert loader.wait_s == 0.0
    list(loader)
    first = loader.wait_s
    assert first >= 0.005  # at least the first read was waited for
    list(loader)
    assert loader.wait_s > first  # accumulates over epochs


def test_argument_validation():
    ds = Instrumented()
    with pytest.raises(ValueError, match="batch_size should be a positive integer value, but "
                                         "got batch_size=0"):
        DataLoader(ds, 0)
    with pytest.raises(ValueError, match="prefetch must be non-negative, got -1"):
        DataLoader(ds, 4, prefetch=-1)


# -- resuming mid-epoch ---------------------------------------------------------------

EPOCHS = 3


def make_loader(n, p, rank, shuffle, sampler_drop_last, drop_last, prefetch, batch=4,
                delay=0.0):
    ds = Instrumented(n=n, delay=delay)
    sampler = DistributedSampler(ds, num_replicas=p, rank=rank, shuffle=shuffle, seed=5,
                                 drop_last=sampler_drop_last)
    return DataLoader(ds, batch, sampler=sampler, drop_last=drop_last, prefetch=prefetch,
                      device="cpu")


def train(loader, stop_after=None):
    """The training loop of a job: the labels of every batch it gets, and the
    loader's state (through JSON, as a checkpoint stores it) when it stops
    after ``stop_after`` batches, or at the end."""
    seen, sampler = [], loader.sampler
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for _, y in loader:
            seen.append(y.tolist())
            if len(seen) == stop_after:
                return seen, json.loads(json.dumps(loader.state_dict()))
    return seen, json.loads(json.dumps(loader.state_dict()))


RESUME_CASES = [(p, rank, shuffle, sampler_drop_last, drop_last)
                for p, rank in ((1, 0), (2, 1), (3, 0), (3, 2), (4, 3))
                for shuffle in (False, True) for sampler_drop_last in (False, True)
                for drop_last in (False, True)]


@pytest.mark.parametrize("p,rank,shuffle,sampler_drop_last,drop_last", RESUME_CASES)
def test_resume_mid_epoch_gives_the_uninterrupted_batches(p, rank, shuffle,
                                                          sampler_drop_last, drop_last):
    """Stop after any number of batches, resume in a fresh loader from the
    state: the two parts together are exactly the uninterrupted run."""
    config = (45, p, rank, shuffle, sampler_drop_last, drop_last)
    whole, end_state = train(make_loader(*config, prefetch=0))
    per_epoch = len(whole) // EPOCHS
    assert per_epoch == len(make_loader(*config, prefetch=0)) > 0
    for stop in range(1, len(whole) + 1):
        prefetch = stop % 3  # inline, and read ahead by 1 or 2 batches
        first, state = train(make_loader(*config, prefetch=prefetch), stop_after=stop)
        resumed = make_loader(*config, prefetch=2 - prefetch)
        resumed.load_state_dict(state)
        assert len(resumed) == per_epoch - stop % per_epoch  # what is left of the epoch
        rest, final = train(resumed)
        assert first + rest == whole, f"stopped after {stop} batches"
        assert final == end_state


def test_state_counts_delivered_batches_not_prefetched_ones():
    loader = make_loader(400, 2, 1, True, False, False, prefetch=5, delay=0.002)
    loader.sampler.set_epoch(7)
    it = iter(loader)
    for _ in range(3):
        next(it)
    time.sleep(0.05)
    assert loader.dataset.reads > 3  # the reader is ahead ...
    state = loader.state_dict()
    assert state["sampler"]["epoch"] == 7  # ... but the state says: 3 batches used
    assert state["sampler"]["start_index"] == 3 * 4 and state["batch_size"] == 4
    it.close()
    assert loader.state_dict() == state  # closing the pass changes nothing
    for _ in loader:  # a whole pass: the next epoch, from its start
        pass
    assert loader.state_dict()["sampler"]["epoch"] == 8
    assert loader.state_dict()["sampler"]["start_index"] == 0


def test_resume_without_a_distributed_sampler_skips_the_delivered_batches():
    ds = Instrumented(n=10)
    loader = DataLoader(ds, 3, prefetch=2, device="cpu")
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    it.close()
    assert state == {"batch_size": 3, "sampler": None, "batches_done": 1}
    resumed = DataLoader(ds, 3, prefetch=0, device="cpu")
    resumed.load_state_dict(state)
    assert len(resumed) == 3
    assert [y.tolist() for _, y in resumed] == [[30, 40, 50], [60, 70, 80], [90]]
    assert [len(y) for _, y in resumed] == [3, 3, 3, 1]  # the next pass is whole again
    assert resumed.state_dict()["batches_done"] == 0


def test_bad_loader_state_raises_naming_the_values():
    loader = make_loader(45, 3, 0, True, False, False, prefetch=0)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="batch_size 5 from a state of batch_size 4"):
        make_loader(45, 3, 0, True, False, False, prefetch=0, batch=5).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset_len 45 in the state, 46 here"):
        make_loader(46, 3, 0, True, False, False, prefetch=0).load_state_dict(state)
    with pytest.raises(ValueError, match="num_replicas 3 in the state, 2 here"):
        make_loader(45, 2, 0, True, False, False, prefetch=0).load_state_dict(state)
    with pytest.raises(ValueError, match="cannot load one"):
        DataLoader(Instrumented(45), 4, sampler=list(range(45))).load_state_dict(state)
