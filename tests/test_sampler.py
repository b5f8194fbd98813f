"""DistributedSampler: PyTorch's index arithmetic, checked serially for every
rank of worlds of 1-5 ranks (each rank built with explicit num_replicas/rank):
coverage, disjointness (padding duplicates exactly as documented), equal
lengths, determinism, the documented generator, resume (a state from any rank
continues every rank; a state of another order raises), validation errors."""
import collections
import json
import math

import h5py
import numpy as np
import pytest

import spmdnet as torch
from spmdnet.data import DataLoader, DistributedSampler, HDF5Dataset

WORLDS = [1, 2, 3, 4, 5]


def lengths(p):
    return sorted({0, 1, p - 1, p, 100, 100 + p + 1})


CASES = [(p, n, shuffle, drop_last) for p in WORLDS for n in lengths(p)
         for shuffle in (False, True) for drop_last in (False, True)]


def reference_order(n, seed, epoch, shuffle):
    """The documented order, written independently of the sampler (randperm
    is checked against PyTorch's draws in test_torch_rng.py)."""
    if not shuffle:
        return np.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).numpy()


def shares(n, p, **kw):
    return [DistributedSampler(n, num_replicas=p, rank=r, **kw) for r in range(p)]


@pytest.mark.parametrize("p,n,shuffle,drop_last", CASES)
def test_coverage_disjointness_equal_lengths(p, n, shuffle, drop_last):
    if drop_last and n < p:
        with pytest.raises(ValueError, match="fewer than the"):
            DistributedSampler(n, num_replicas=p, rank=0, shuffle=shuffle, drop_last=True)
        return
    samplers = shares(n, p, shuffle=shuffle, seed=7, drop_last=drop_last)
    for s in samplers:
        s.set_epoch(3)
    per_rank = [s.indices() for s in samplers]
    perm = reference_order(n, 7, 3, shuffle)

    # equal lengths, and len() says so
    expected_len = n // p if drop_last else math.ceil(n / p)
    assert [len(ix) for ix in per_rank] == [expected_len] * p
    assert [len(s) for s in samplers] == [expected_len] * p
    assert all(ix.dtype == np.int64 for ix in per_rank)
    assert all(list(s) == ix.tolist() for s, ix in zip(samplers, per_rank))

    everything = np.concatenate(per_rank)
    counts = collections.Counter(everything.tolist())
    if drop_last:
        # disjoint, and the union is everything but the dropped tail of the order
        total = (n // p) * p
        assert len(everything) == total == len(counts)
        assert set(counts) == set(perm[:total].tolist())
        assert not set(counts) & set(perm[total:].tolist())
    else:
        # padded to ceil(n/p)*p by repeating the order from its start: the
        # duplicates are exactly perm[0], perm[1], ... (cyclically if the padding
        # is longer than the data)
        total = math.ceil(n / p) * p
        assert len(everything) == total
        assert set(counts) == set(range(n))
        padding = [perm[i % n] for i in range(total - n)] if n else []
        extra = counts - collections.Counter(range(n))
        assert extra == collections.Counter(np.asarray(padding, dtype=int).tolist())
        if total - n <= n:  # the common case: the first total-n elements, once more each
            assert sorted(extra.elements()) == sorted(perm[:total - n].tolist())

    # strided, not contiguous: rank r holds positions r, r+p, r+2p, ... of the order
    order = np.concatenate([perm, np.resize(perm, total - n)]) if n and not drop_last \
        else perm[:total]
    for r, ix in enumerate(per_rank):
        np.testing.assert_array_equal(ix, order[r::p])


@pytest.mark.parametrize("p,n,shuffle,drop_last", CASES)
def test_determinism(p, n, shuffle, drop_last):
    if drop_last and n < p:
        return
    for r in range(p):
        a = DistributedSampler(n, num_replicas=p, rank=r, shuffle=shuffle, seed=11,
                               drop_last=drop_last)
        b = DistributedSampler(n, num_replicas=p, rank=r, shuffle=shuffle, seed=11,
                               drop_last=drop_last)
        a.set_epoch(5)
        b.set_epoch(5)
        np.testing.assert_array_equal(a.indices(), b.indices())
        np.testing.assert_array_equal(a.indices(), a.indices())  # repeatable
    s = DistributedSampler(n, num_replicas=p, rank=0, shuffle=shuffle, seed=11,
                           drop_last=drop_last)
    s.set_epoch(0)
    first = s.global_indices()
    s.set_epoch(1)
    second = s.global_indices()
    if shuffle and n > 2:  # 3 items have 6 orders: two epochs may draw the same one
        orders = set()
        for epoch in range(6):
            s.set_epoch(epoch)
            orders.add(tuple(s.global_indices().tolist()))
        assert len(orders) > 1, "a new epoch must reshuffle"
        if not drop_last:  # both are permutations of everything, before the padding
            assert sorted(first[:n].tolist()) == sorted(second[:n].tolist()) == list(range(n))
    elif not shuffle:
        np.testing.assert_array_equal(first, second)


def test_epoch_is_what_reshuffles_and_forgetting_set_epoch_repeats():
    s = DistributedSampler(100, num_replicas=2, rank=0, seed=3)
    epoch0 = s.indices()
    np.testing.assert_array_equal(s.indices(), epoch0)  # no set_epoch: same order
    s.set_epoch(1)
    assert not np.array_equal(s.indices(), epoch0)
    other_seed = DistributedSampler(100, num_replicas=2, rank=0, seed=4)
    assert not np.array_equal(other_seed.indices(), epoch0)
    # seed + epoch is all that matters
    a = DistributedSampler(100, num_replicas=2, rank=0, seed=3)
    a.set_epoch(1)
    b = DistributedSampler(100, num_replicas=2, rank=0, seed=4)
    b.set_epoch(0)
    np.testing.assert_array_equal(a.indices(), b.indices())


@pytest.mark.parametrize("p", WORLDS)
@pytest.mark.parametrize("drop_last", [False, True])
def test_reproduce_order_with_documented_generator(p, drop_last):
    n, seed, epoch = 103, 42, 7
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).numpy()
    if drop_last:
        full = perm[:n - n % p]
    else:
        pad = -n % p
        full = np.concatenate([perm, perm[:pad]])
    for r in range(p):
        s = DistributedSampler(n, num_replicas=p, rank=r, seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        np.testing.assert_array_equal(s.indices(), full[r::p])


def test_documented_example_first_batches():
    """shuffle=False, 100 samples, 4 ranks, batches of 5: rank r's first batch
    is [r, r+4, r+8, r+12, r+16]."""

    class Ids:
        def __len__(self):
            return 100

        def __getitem__(self, index):
            return np.asarray(index), np.asarray(index)

    for r in range(4):
        s = DistributedSampler(100, num_replicas=4, rank=r, shuffle=False)
        assert s.indices()[:5].tolist() == [r, r + 4, r + 8, r + 12, r + 16]
        x, _ = next(iter(DataLoader(Ids(), 5, sampler=s, prefetch=0, device="cpu")))
        assert x.tolist() == [r, r + 4, r + 8, r + 12, r + 16]


def test_world_from_a_communicator():
    class Comm:
        def Get_size(self):
            return 5

        def Get_rank(self):
            return 3

    s = DistributedSampler(23, comm=Comm(), shuffle=False)
    assert (s.num_replicas, s.rank) == (5, 3)
    assert s.indices().tolist() == [3, 8, 13, 18, 0]  # padded with index 0
    s = DistributedSampler(23, num_replicas=4, comm=Comm(), shuffle=False)  # rank from comm
    assert (s.num_replicas, s.rank) == (4, 3)
    s = DistributedSampler(23, rank=1, comm=Comm(), shuffle=False)  # size from comm
    assert (s.num_replicas, s.rank) == (5, 1)


@pytest.mark.parametrize("drop_last", [False, True])
def test_set_start_index_equals_slicing(drop_last):
    for r in range(3):
        s = DistributedSampler(50, num_replicas=3, rank=r, seed=1, drop_last=drop_last)
        s.set_epoch(2)
        full = s.indices()
        for k in (0, 1, 7, len(full)):
            s.set_start_index(k)
            np.testing.assert_array_equal(s.indices(), full[k:])
            assert len(s) == len(full) - k
            assert list(s) == full[k:].tolist()
        with pytest.raises(ValueError, match=r"\[0, "):
            s.set_start_index(len(full) + 1)
        with pytest.raises(ValueError):
            s.set_start_index(-1)


def test_start_index_lasts_for_its_epoch_only_and_round_trips():
    s = DistributedSampler(40, num_replicas=2, rank=1, seed=9)
    s.set_epoch(4)
    full4 = s.indices()
    s.set_start_index(6)
    s.set_epoch(4)  # a resumed loop calls set_epoch for the resumed epoch: kept
    np.testing.assert_array_equal(s.indices(), full4[6:])
    state = s.state_dict()
    assert state == {"epoch": 4, "start_index": 6, "seed": 9, "dataset_len": 40,
                     "num_replicas": 2, "shuffle": True, "drop_last": False}
    assert json.loads(json.dumps(state)) == state  # goes into a checkpoint as it is

    t = DistributedSampler(40, num_replicas=2, rank=1, seed=9)
    t.load_state_dict(json.loads(json.dumps(state)))
    np.testing.assert_array_equal(t.indices(), full4[6:])
    assert len(t) == 14

    s.set_epoch(5)  # the next epoch starts from its beginning
    assert s.start_index == 0 and len(s) == 20
    fresh = DistributedSampler(40, num_replicas=2, rank=1, seed=9)
    fresh.set_epoch(5)
    np.testing.assert_array_equal(s.indices(), fresh.indices())


@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_state_from_any_rank_resumes_every_rank(p, shuffle, drop_last):
    """One rank's state (rank 0's, as a checkpoint holds) continues every rank
    where an uninterrupted epoch would be, for every position."""
    n = 23
    for rank in range(p):
        kw = dict(num_replicas=p, shuffle=shuffle, seed=3, drop_last=drop_last)
        saved = DistributedSampler(n, rank=0, **kw)
        saved.set_epoch(2)
        whole = DistributedSampler(n, rank=rank, **kw)
        whole.set_epoch(2)
        full = whole.indices()
        for k in range(len(full) + 1):
            saved.set_start_index(k)
            resumed = DistributedSampler(n, rank=rank, **kw)
            resumed.load_state_dict(saved.state_dict())
            assert resumed.epoch == 2 and len(resumed) == len(full) - k
            np.testing.assert_array_equal(resumed.indices(), full[k:])


@pytest.mark.parametrize("change,named", [
    ({"dataset": 41}, "dataset_len 40 in the state, 41 here"),
    ({"num_replicas": 4}, "num_replicas 2 in the state, 4 here"),
    ({"seed": 0}, "seed 9 in the state, 0 here"),
    ({"shuffle": False}, "shuffle True in the state, False here"),
    ({"drop_last": True}, "drop_last False in the state, True here"),
])
def test_state_of_another_order_raises_naming_the_values(change, named):
    s = DistributedSampler(40, num_replicas=2, rank=1, seed=9)
    s.set_epoch(3)
    s.set_start_index(5)
    kw = dict(dict(dataset=40, num_replicas=2, rank=1, seed=9), **change)
    other = DistributedSampler(**kw)
    with pytest.raises(ValueError, match="another order") as err:
        other.load_state_dict(s.state_dict())
    assert named in str(err.value)
    assert (other.epoch, other.start_index) == (0, 0)  # nothing half-loaded
    both = DistributedSampler(30, num_replicas=3, rank=0, seed=1)
    with pytest.raises(ValueError) as err:
        both.load_state_dict(s.state_dict())
    assert "dataset_len 40" in str(err.value) and "num_replicas 2" in str(err.value) \
        and "seed 9" in str(err.value)


def test_state_without_the_order_keys_still_loads():
    """A state written before the order was recorded (epoch, start_index, seed)."""
    s = DistributedSampler(40, num_replicas=2, rank=0, seed=9)
    s.load_state_dict({"epoch": 2, "start_index": 4, "seed": 9})
    assert (s.epoch, s.start_index, len(s)) == (2, 4, 16)
    with pytest.raises(ValueError, match="seed 1 in the state, 9 here"):
        s.load_state_dict({"epoch": 2, "start_index": 4, "seed": 1})
    with pytest.raises(ValueError, match=r"start index 21 outside \[0, 20\]"):
        s.load_state_dict({"epoch": 2, "start_index": 21})


def test_accepts_a_dataset_or_a_length():
    class Sized:
        def __len__(self):
            return 17

    a = DistributedSampler(Sized(), num_replicas=2, rank=0)
    b = DistributedSampler(np.int64(17), num_replicas=2, rank=0)
    np.testing.assert_array_equal(a.indices(), b.indices())
    assert a.dataset_len == 17 and len(a) == 9


@pytest.mark.parametrize("rank", [-1, 4, 10])
def test_rank_out_of_range_names_the_valid_interval(rank):
    with pytest.raises(ValueError) as err:
        DistributedSampler(100, num_replicas=4, rank=rank)
    msg = str(err.value)
    assert f"rank {rank}" in msg and "[0, 3]" in msg and "num_replicas=4" in msg


@pytest.mark.parametrize("num_replicas", [0, -2])
def test_num_replicas_below_one(num_replicas):
    with pytest.raises(ValueError, match=f"at least 1, got {num_replicas}"):
        DistributedSampler(100, num_replicas=num_replicas, rank=0)


def test_dataset_smaller_than_world_with_drop_last_names_file_key_length_world(tmp_path):
    path = tmp_path / "tiny.h5"
    with h5py.File(path, "w") as f:
        f["images"] = np.zeros((3, 2), np.float32)
        f["labels"] = np.zeros(3, np.int64)
    ds = HDF5Dataset(path, x="images", y="labels")
    with pytest.raises(ValueError) as err:
        DistributedSampler(ds, num_replicas=4, rank=2, drop_last=True)
    msg = str(err.value)
    assert str(path) in msg and "'images'" in msg and "3 samples" in msg and "4 ranks" in msg
    # without drop_last the same dataset is padded, and with 3 ranks it fits
    assert len(DistributedSampler(ds, num_replicas=4, rank=2)) == 1
    assert len(DistributedSampler(ds, num_replicas=3, rank=2, drop_last=True)) == 1
    with pytest.raises(ValueError, match="0 samples, fewer than the 2 ranks"):
        DistributedSampler(0, num_replicas=2, rank=0, drop_last=True)
