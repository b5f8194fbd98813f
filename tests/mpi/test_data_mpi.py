"""The data pipeline live under MPI: every rank gets the same number of
batches, all ranks read one file concurrently and see the same bytes, bad
files raise on every rank, exact evaluation counts each sample once, and
files written by rank 0 are readable by all after the barrier.

Shared files live in a directory made by rank 0 and broadcast to all."""
import hashlib
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as sn
from spmdnet import data, dist, nn
from spmdnet.data import DataLoader, DistributedSampler, HDF5Dataset, datasets

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD


@pytest.fixture(scope="module", autouse=True)
def world():
    return dist.init()


@pytest.fixture
def shared_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("data")) if COMM.Get_rank() == 0 else None
    return Path(COMM.bcast(path, root=0))


def on_root(fn):
    """Run fn on rank 0 only, then barrier (an error on rank 0 aborts all)."""
    if COMM.Get_rank() == 0:
        fn()
    COMM.Barrier()


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def all_equal(value):
    values = COMM.allgather(value)
    assert all(v == values[0] for v in values), f"ranks disagree: {values}"
    return values


class Ids:
    """An in-memory dataset whose samples are their own indices."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        index = np.asarray(index)
        return index.astype(np.float32)[..., None], index  # an index array or one index


# -- equal batch counts -------------------------------------------------------------

def lengths():
    p = COMM.Get_size()
    return sorted({0, 1, p - 1, p, 37, 100, 100 + p + 1, 1001})


@pytest.mark.parametrize("sampler_drop_last", [False, True])
@pytest.mark.parametrize("loader_drop_last", [False, True])
@pytest.mark.parametrize("batch", [1, 4, 7])
def test_every_rank_gets_the_same_number_of_batches(sampler_drop_last, loader_drop_last,
                                                    batch):
    p = COMM.Get_size()
    for n in lengths():
        if sampler_drop_last and n < p:
            with pytest.raises(ValueError, match=f"{n} samples, fewer than the {p} ranks"):
                DistributedSampler(n, drop_last=True)
            continue
        sampler = DistributedSampler(Ids(n), seed=n, drop_last=sampler_drop_last)
        assert (sampler.num_replicas, sampler.rank) == (p, COMM.Get_rank())
        loader = DataLoader(Ids(n), batch, sampler=sampler, drop_last=loader_drop_last,
                            prefetch=2, device="cpu")
        for epoch in range(2):
            sampler.set_epoch(epoch)
            seen = [y for _, y in loader]
            per_rank = len(sampler)
            expected = per_rank // batch if loader_drop_last else math.ceil(per_rank / batch)
            all_equal((len(loader), len(seen)))
            assert len(seen) == len(loader) == expected
            # the ranks together read what the sampler arithmetic says: everything
            # unless dropped, and each rank exactly its own share
            mine = np.concatenate(seen) if seen else np.zeros(0, np.int64)
            stop = expected * batch if loader_drop_last else per_rank
            np.testing.assert_array_equal(mine, sampler.indices()[:stop])
            union = set(np.concatenate(COMM.allgather(mine)).tolist())
            if not sampler_drop_last and not loader_drop_last:
                assert union == set(range(n))
            assert union <= set(range(n))


def test_uneven_data_never_hangs_a_collective_per_step():
    """A step with an allreduce per batch: ranks agree on the step count, so
    nothing waits (a disagreement would hang here, caught by the timeout)."""
    p = COMM.Get_size()
    n = 10 * p + p // 2 + 1  # not divisible by the world size
    for drop_last in (False, True):
        sampler = DistributedSampler(n, drop_last=drop_last, seed=1)
        loader = DataLoader(Ids(n), 3, sampler=sampler, device="cpu")
        all_equal(len(loader))
        steps = 0
        for x, _ in loader:
            total = dist.allreduce(np.array([x.shape[0]], np.int64))
            steps += 1
            assert total[0] <= 3 * p
        all_equal(steps)


def test_every_rank_reads_the_same_file_concurrently(shared_dir):
    path = shared_dir / "shared.h5"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 17)).astype(np.float32)
    y = rng.integers(0, 10, 3000)

    def write():
        with h5py.File(path, "w") as f:
            f["x"], f["y"] = x, y
            f.create_dataset("xz", data=x, chunks=(64, 17), compression="gzip")

    on_root(write)
    common = np.random.default_rng(1).integers(0, 3000, 500)  # the same on all ranks
    mine = np.random.default_rng(100 + COMM.Get_rank()).integers(0, 3000, 300)
    for kw in ({}, {"locking": False}, {"x": "xz"}):
        COMM.Barrier()  # open at the same time
        ds = HDF5Dataset(path, cache=False, **kw)
        xs, ys = ds[common]
        all_equal(digest(xs, ys))
        np.testing.assert_array_equal(xs, x[common])
        mx, my = ds[mine]
        np.testing.assert_array_equal(mx, x[mine])
        np.testing.assert_array_equal(my, y[mine])
        loader = DataLoader(ds, 64, sampler=DistributedSampler(ds, seed=3), device="cpu")
        got = np.concatenate([b for b, _ in loader])
        np.testing.assert_array_equal(got, x[loader.sampler.indices()])
        ds.close()
        COMM.Barrier()  # all closed before the next open with other flags


# -- bad inputs raise on every rank -------------------------------------------------

def test_bad_files_raise_on_every_rank(shared_dir):
    p, r = COMM.Get_size(), COMM.Get_rank()
    good = shared_dir / "good.h5"
    truncated = shared_dir / "truncated.h5"
    mismatch = shared_dir / "mismatch.h5"
    garbage = shared_dir / "garbage.h5"
    tiny = shared_dir / "tiny.h5"

    def write():
        for path, ny in ((good, 40), (truncated, 40), (mismatch, 39)):
            with h5py.File(path, "w") as f:
                f["x"] = np.zeros((40, 5), np.float32)
                f["y"] = np.zeros(ny, np.int64)
        with open(truncated, "r+b") as f:
            f.truncate(truncated.stat().st_size // 2)
        garbage.write_bytes(b"\x89HDF?" * 100)
        with h5py.File(tiny, "w") as f:
            f["x"] = np.zeros((p - 1, 5), np.float32)
            f["y"] = np.zeros(p - 1, np.int64)

    on_root(write)
    with pytest.raises(FileNotFoundError, match="missing.h5"):
        HDF5Dataset(shared_dir / "missing.h5")
    with pytest.raises(KeyError) as err:
        HDF5Dataset(good, x="images")
    assert str(good) in str(err.value) and "['x', 'y']" in str(err.value)
    with pytest.raises(ValueError) as err:
        HDF5Dataset(mismatch)
    assert str(mismatch) in str(err.value) and "40" in str(err.value) and "39" in str(err.value)
    for bad in (truncated, garbage):
        with pytest.raises(OSError) as err:
            HDF5Dataset(bad)
        assert str(bad) in str(err.value) and f"rank {r}" in str(err.value)
    if p > 1:  # on one rank "tiny" is empty, which opening already refuses
        small = HDF5Dataset(tiny)
        with pytest.raises(ValueError) as err:
            DistributedSampler(small, drop_last=True)
        msg = str(err.value)
        assert str(tiny) in msg and "'x'" in msg and f"{p - 1} samples" in msg
        assert f"{p} ranks" in msg
    else:
        with pytest.raises(ValueError, match="holds no samples"):
            HDF5Dataset(tiny)
    with pytest.raises(ValueError, match=rf"\[0, {p - 1}\]"):
        DistributedSampler(40, rank=p)
    all_equal("raised")  # every rank got here: all raised, nobody hangs


# -- exact evaluation ---------------------------------------------------------------

class Recording:
    """Wraps a dataset and records which indices were read."""

    def __init__(self, ds):
        self.ds, self.read = ds, []

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, index):
        self.read.append(np.asarray(index).copy())
        return self.ds[index]


def known_answer_problem(n):
    """x[i] = 2 * onehot(i % 3), label (i % 3) except every fifth sample; a
    Linear with identity weights gives logits x, so sample i is correct iff
    i % 5 != 0 and its loss is log(e^2 + 2) - 2 (correct) or log(e^2 + 2)."""
    i = np.arange(n)
    x = np.zeros((n, 3))
    x[i, i % 3] = 2.0
    y = np.where(i % 5 == 0, (i + 1) % 3, i % 3).astype(np.int64)
    correct = int((i % 5 != 0).sum())
    loss_sum = correct * (np.log(np.e**2 + 2) - 2) + (n - correct) * np.log(np.e**2 + 2)
    return x, y, correct, loss_sum


def identity_model():
    model = nn.Linear(3, 3)
    model.weight.data[...] = np.eye(3)
    model.bias.data[...] = 0.0
    return model


@pytest.mark.parametrize("extra", [1, 2, 3])
def test_exact_evaluation_counts_every_sample_once(shared_dir, extra):
    sn.set_default_dtype(np.float64)
    try:
        p = COMM.Get_size()
        for n in (extra, 5 * p + extra, 101 * p + extra):  # never divisible when p > extra
            x, y, correct, loss_sum = known_answer_problem(n)
            path = datasets.write_hdf5(shared_dir / f"eval{n}.h5", x, y)  # rank 0, barrier
            ds = Recording(HDF5Dataset(path, cache=False))
            model = identity_model()
            model.train()
            result = data.evaluate(model, ds, batch_size=4)
            assert model.training  # restored
            assert result["count"] == n
            assert result["accuracy"] == correct / n
            np.testing.assert_allclose(result["loss"], loss_sum / n, rtol=1e-12)
            # each sample read by exactly one rank, none twice (no padding)
            mine = np.concatenate(ds.read) if ds.read else np.zeros(0, np.int64)
            everyone = np.concatenate(COMM.allgather(mine))
            assert sorted(everyone.tolist()) == list(range(n))
            assert len(mine) == len(data.shard_indices(n, COMM.Get_rank(), p))
            # equals a serial evaluation of the whole set
            serial = data.evaluate(model, HDF5Dataset(path), batch_size=1000,
                                   comm=MPI.COMM_SELF)
            assert serial["count"] == n and serial["accuracy"] == result["accuracy"]
            np.testing.assert_allclose(serial["loss"], result["loss"], rtol=1e-12)
            all_equal((result["count"], result["accuracy"], round(result["loss"], 12)))
    finally:
        sn.set_default_dtype(np.float32)


def test_shard_indices_partition_the_range():
    p = COMM.Get_size()
    for n in (0, 1, p - 1, p, 97):
        shards = [data.shard_indices(n, r, p) for r in range(p)]
        assert sorted(np.concatenate(shards).tolist()) == list(range(n))
        assert max(map(len, shards)) - min(map(len, shards)) <= 1


# -- writers: rank 0 writes, everyone reads after the barrier -------------------------

def test_write_hdf5_from_rank_0_then_all_ranks_read(shared_dir):
    r = COMM.Get_rank()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((257, 6)).astype(np.float32)
    y = rng.integers(0, 4, 257)
    # only rank 0's arrays are written: the others pass different ones
    path = datasets.write_hdf5(shared_dir / "w.h5", x + r, y + r)
    all_equal(path)
    ds = HDF5Dataset(path, cache=False)
    got = ds[np.arange(257)]
    np.testing.assert_array_equal(got[0], x)
    np.testing.assert_array_equal(got[1], y)
    assert sorted(p.name for p in shared_dir.iterdir()) == ["w.h5"]  # no temporary left
    COMM.Barrier()  # every rank has looked before rank 0 writes the next files there

    train, test = datasets.make_digits(shared_dir / "digits")
    sizes = all_equal((len(HDF5Dataset(train)), len(HDF5Dataset(test))))
    assert sum(sizes[0]) == 1797
    all_equal(digest(*HDF5Dataset(test)[np.arange(359)]))
    synth = datasets.make_synthetic(shared_dir / "s.h5", 1000, features=8, seed=4)
    all_equal(digest(*HDF5Dataset(synth)[np.arange(1000)]))
