"""DataLoader(num_workers > 0): the batches of num_workers=0 (hand-computed),
get_worker_info and per-worker seeds, IterableDataset sharding in PyTorch's
order, worker_init_fn, errors re-raised with the worker id, a dead worker and
a timeout as RuntimeErrors, persistent workers, exact resume at any worker
count, spawned workers that never start MPI, and the speed-up on a slow
dataset."""
import json
import os
import random
import sys
import time

import numpy as np
import pytest

import spmdnet as torch
from tests.helpers.launch import ROOT, run_mpi
from spmdnet.utils.data import (DataLoader, Dataset, DistributedSampler, IterableDataset,
                                get_worker_info)


class Squares(Dataset):
    """Sample i: (i, i * i); optionally slow, failing at one index, or
    dying there."""

    def __init__(self, n=10, delay=0.0, fail_at=None, die_at=None):
        self.n, self.delay, self.fail_at, self.die_at = n, delay, fail_at, die_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.fail_at:
            raise KeyError(f"sample {i} is broken")
        if i == self.die_at:
            os._exit(7)
        if self.delay:
            time.sleep(self.delay)
        return i, i * i


class WhoLoads(Dataset):
    """Sample i: the loading worker's (id, num_workers, seed) and draws from
    the generators it seeds."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return {"id": info.id, "num_workers": info.num_workers, "seed": info.seed,
                "random": random.random(), "numpy": float(np.random.random()),
                "spmdnet": float(torch.rand(1).item()),
                "mpi": "mpi4py.MPI" in sys.modules}


class Range(IterableDataset):
    """0..n-1, split between workers as PyTorch's documentation shows."""

    def __init__(self, n, shard=True):
        self.n, self.shard = n, shard

    def __iter__(self):
        info = get_worker_info()
        if info is None or not self.shard:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


def test_batches_equal_those_without_workers():
    ds = Squares(10)
    for workers in (1, 2, 3):
        got = [[t.tolist() for t in b] for b in DataLoader(ds, batch_size=3,
                                                            num_workers=workers)]
        assert got == [[[0, 1, 2], [0, 1, 4]], [[3, 4, 5], [9, 16, 25]],
                       [[6, 7, 8], [36, 49, 64]], [[9], [81]]]
    assert get_worker_info() is None  # the rank's own process


def test_worker_info_and_per_worker_seeds():
    loader = DataLoader(WhoLoads(), batch_size=2, num_workers=2,
                        generator=torch.Generator().manual_seed(5))
    batches = list(loader)
    ids = [b["id"].tolist() for b in batches]
    assert ids == [[0, 0], [1, 1], [0, 0], [1, 1]]  # tasks go round-robin, in order
    assert all(b["num_workers"].tolist() == [2, 2] for b in batches)
    seeds = {b["id"].tolist()[0]: b["seed"].tolist()[0] for b in batches}
    assert seeds[1] == seeds[0] + 1  # base_seed + worker_id, as PyTorch
    for gen in ("random", "numpy", "spmdnet"):
        draws = [b[gen].tolist() for b in batches]
        assert draws[0] != draws[1]  # the two workers draw different streams
    again = list(DataLoader(WhoLoads(), batch_size=2, num_workers=2,
                            generator=torch.Generator().manual_seed(5)))
    assert [b["numpy"].tolist() for b in again] == [b["numpy"].tolist() for b in batches]


def test_iterable_dataset_sharding_and_order_as_pytorch():
    got = [b.tolist() for b in DataLoader(Range(7), batch_size=2, num_workers=2)]
    assert got == [[0, 2], [1, 3], [4, 6], [5]]  # worker 0, worker 1, worker 0, ...
    dropped = [b.tolist() for b in DataLoader(Range(7), batch_size=2, num_workers=2,
                                              drop_last=True)]
    assert dropped == [[0, 2], [1, 3], [4, 6]]  # each worker drops its own short batch
    copies = list(DataLoader(Range(3, shard=False), batch_size=None, num_workers=2))
    assert copies == [0, 0, 1, 1, 2, 2]  # not sharded: every worker yields everything


def test_worker_init_fn_runs_in_each_worker():
    class Marked(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return get_worker_info().dataset.mark

    def init(worker_id):
        get_worker_info().dataset.mark = 100 + worker_id

    ds = Marked()
    got = [b.tolist() for b in DataLoader(ds, batch_size=1, num_workers=2, worker_init_fn=init)]
    assert got == [[100], [101], [100], [101]] and not hasattr(ds, "mark")


def test_worker_error_is_raised_with_its_type_and_worker_id():
    loader = DataLoader(Squares(10, fail_at=4), batch_size=2, num_workers=2)
    with pytest.raises(KeyError, match=r"Caught KeyError in DataLoader worker process 0\."
                                       r"(.|\n)*sample 4 is broken"):
        list(loader)


def test_a_dead_worker_and_a_timeout_are_runtime_errors():
    with pytest.raises(RuntimeError, match=r"DataLoader worker 1 \(pid \d+\) exited "
                                           "unexpectedly with exit code 7"):
        list(DataLoader(Squares(10, die_at=3), batch_size=3, num_workers=2))
    with pytest.raises(RuntimeError, match="DataLoader timed out after 0.2 seconds"):
        list(DataLoader(Squares(4, delay=1.0), batch_size=2, num_workers=1, timeout=0.2))


def test_persistent_workers_serve_every_epoch():
    loader = DataLoader(Range(5), batch_size=2, num_workers=2, persistent_workers=True)
    first = [b.tolist() for b in loader]
    pids = [w.pid for w in loader._pool.workers]
    second = [b.tolist() for b in loader]
    assert first == second == [[0, 2], [1, 3], [4]]
    assert [w.pid for w in loader._pool.workers] == pids  # the same processes
    loader._pool.shutdown()


def run(loader, epochs, stop_after=None):
    seen = []
    for epoch in range(loader.sampler.epoch, epochs):
        loader.sampler.set_epoch(epoch)
        for _, y in loader:
            seen.append(y.tolist())
            if len(seen) == stop_after:
                return seen, json.loads(json.dumps(loader.state_dict()))
    return seen, None


@pytest.mark.parametrize("before,after", [(0, 2), (2, 0), (2, 3)])
def test_resume_is_exact_at_any_worker_count(before, after):
    def make(workers):
        ds = Squares(23)
        sampler = DistributedSampler(ds, num_replicas=2, rank=1, seed=4)
        return DataLoader(ds, batch_size=3, sampler=sampler, num_workers=workers)

    whole, _ = run(make(0), 2)
    for stop in (1, 4, 5, 7):
        first, state = run(make(before), 2, stop_after=stop)
        resumed = make(after)
        resumed.load_state_dict(state)
        rest, _ = run(resumed, 2)
        assert first + rest == whole, f"stopped after {stop} batches"


def test_spawned_workers_never_start_mpi():
    loader = DataLoader(WhoLoads(), batch_size=4, num_workers=2,
                        multiprocessing_context="spawn")
    assert [b["mpi"].tolist() for b in loader] == [[False] * 4] * 2


def test_workers_load_a_slow_dataset_in_parallel():
    """Sleeping reads (I/O-bound, as a remote file system): 4 workers wait
    side by side; the time is several times shorter than without workers."""
    ds = Squares(48, delay=0.04)
    t0 = time.perf_counter()
    serial = [b[0].tolist() for b in DataLoader(ds, batch_size=4)]
    serial_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    loader = DataLoader(ds, batch_size=4, num_workers=4)
    parallel = [b[0].tolist() for b in loader]
    parallel_s = time.perf_counter() - t0
    assert parallel == serial
    assert parallel_s < 0.6 * serial_s, (serial_s, parallel_s)
    # the loop did nothing but wait: most of the 48 * 40 ms / 4 workers of reading
    assert 0.3 <= loader.wait_s <= parallel_s


@pytest.mark.parametrize("init_mpi", ["0", "1"])
def test_the_cifar10_tutorial_shape_runs_under_mpirun_with_two_workers(init_mpi):
    script = ROOT / "tests/helpers/loader_cifar_tutorial.py"
    # with MPI initialised, also under mpi4py's runner (its hooks abort on errors)
    args = ("-m", "mpi4py", script) if init_mpi == "1" else (script,)
    code, out, err, _ = run_mpi(2, *args, timeout=120, env={"INIT_MPI": init_mpi})
    assert code == 0, err
    assert out.count("Finished Training") == 2 and out.count("samples: 64") == 4
    assert (out.count("ranks: 2 max loss") == 2) == (init_mpi == "1")
