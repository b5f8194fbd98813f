"""Checkpoints loaded at another world size, and the faults around it, on
every rank: a checkpoint saved by some of the ranks (a smaller job: a
sub-communicator) is resharded for all of them (tensor-parallel parts by
(tp, pp) coordinate, the sampler position in global samples, the RNG states
of the ranks that existed); a pipeline checkpoint missing a rank's part is
skipped for the newest whole one on every rank alike; a resume never starts
from scratch over checkpoints it cannot use, nor falls back past an intact
one of another tensor-parallel layout."""
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as sn
from spmdnet import checkpoint, data, dist, nn
from spmdnet import random as sn_random
from tests.helpers.shared_dirs import shared_checkpoint_directory

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture
def shared(tmp_path_factory, monkeypatch):
    return shared_checkpoint_directory(tmp_path_factory, monkeypatch)


def part_model(value, rank):
    """A model whose values differ per part, as a tensor/pipeline part does."""
    model = nn.Linear(2, 2)
    for p in model.parameters():
        p.array[...] = value + rank
    return model


def first_ranks(n):
    """A communicator of world ranks 0..n-1 (None on the others): a smaller job."""
    comm = MPI.COMM_WORLD.Split(0 if dist.rank() < n else MPI.UNDEFINED, dist.rank())
    return None if comm == MPI.COMM_NULL else comm


def test_tensor_parallel_parts_load_at_a_larger_data_parallel_size(shared):
    if dist.size() != 4:
        pytest.skip("tp=2 saved by 2 ranks, loaded by 4 (dp 1 -> 2)")
    small = first_ranks(2)
    if small is not None:
        with dist.Mesh(tp=2, comm=small) as mesh:
            sn.save_checkpoint(shared + "/", part_model(10.0, mesh.tp_rank), step=5,
                               comm=small, mesh=mesh)
        small.Free()
    dist.barrier()
    with dist.Mesh(tp=2) as mesh:
        model = part_model(0.0, 0)
        assert checkpoint.resume(shared, model, mesh=mesh)["step"] == 5
        np.testing.assert_array_equal(model.weight.array, 10.0 + mesh.tp_rank)


def saved_sampler(start):
    sampler = data.DistributedSampler(48, num_replicas=1, rank=0, seed=1, drop_last=True)
    sampler.set_epoch(2)
    sampler.set_start_index(start)
    return sampler


def save_on_rank_0(shared, start):
    """A checkpoint of a one-rank job: a model, its sampler at ``start``
    and its RNG state (returned on rank 0)."""
    rng = None
    alone = first_ranks(1)
    if alone is not None:
        sn.manual_seed(123)  # not the loading ranks' seeds
        model = part_model(4.0, 0)
        rng = sn_random.snapshot()  # what the checkpoint saves
        sn.save_checkpoint(shared + "/", model, sampler=saved_sampler(start), step=7,
                           comm=alone)
        alone.Free()
    dist.barrier()
    return rng


def test_data_parallel_state_sampler_and_rng_load_at_a_larger_size(shared):
    saved_rng = save_on_rank_0(shared, start=12)  # 12 samples: shared by 1, 2, 3 or 4 ranks
    sn.manual_seed(1000 + dist.rank())
    sampler = data.DistributedSampler(48, seed=1, drop_last=True)
    model = part_model(0.0, 0)
    own_rng = sn_random.snapshot()
    assert checkpoint.resume(shared, model, sampler=sampler)["step"] == 7
    np.testing.assert_array_equal(model.weight.array, 4.0)
    assert (sampler.epoch, sampler.start_index) == (2, 12 // dist.size())
    rest = MPI.COMM_WORLD.allgather(sampler.indices())  # the samples not yet consumed
    whole = saved_sampler(0).global_indices()
    assert sorted(np.concatenate(rest).tolist()) == sorted(whole[12:].tolist())
    # rank 0 existed in the saved job: its RNG state is back; the others keep theirs
    want = saved_rng if dist.rank() == 0 else own_rng
    assert sn_random.snapshot() == want


def test_a_position_the_new_size_cannot_share_is_refused_on_every_rank(shared):
    if dist.size() != 4:
        pytest.skip("6 samples consumed on 1 rank cannot be shared by 4")
    save_on_rank_0(shared, start=6)
    model = part_model(0.0, 0)
    with pytest.raises(sn.CheckpointError, match="consumed 6 samples of epoch 2 on 1 "
                                                  "replicas.*4 replicas cannot share"):
        checkpoint.resume(shared, model, sampler=data.DistributedSampler(48, seed=1,
                                                                         drop_last=True))
    np.testing.assert_array_equal(model.weight.array, 0.0)  # nothing was loaded


@pytest.mark.parametrize("missing", ["the part", "its arrays"])
def test_a_pipeline_checkpoint_missing_a_part_falls_back_on_every_rank(shared, missing):
    if dist.size() % 2:
        pytest.skip("pp=2 needs an even number of ranks")
    with dist.Mesh(pp=2) as mesh:
        for step in (1, 2):
            sn.save_checkpoint(shared + "/", part_model(10.0 * step, dist.rank()), step=step,
                               mesh=mesh)
        last = dist.size() - 1
        if dist.rank() == 0:
            with h5py.File(Path(shared) / "ckpt-00000002.h5", "r+") as f:
                del f[f"rank{last}" if missing == "the part" else f"rank{last}/model"]
        dist.barrier()
        model = part_model(0.0, 0)
        assert checkpoint.resume(shared, model, mesh=mesh)["step"] == 1
        np.testing.assert_array_equal(model.weight.array, 10.0 + dist.rank())
        assert sn.latest_checkpoint(shared).endswith("ckpt-00000001.h5")


def test_a_resume_never_starts_from_scratch_over_damaged_checkpoints(shared):
    sn.save_checkpoint(shared + "/", part_model(1.0, 0), step=1)
    if dist.rank() == 0:
        with h5py.File(Path(shared) / "ckpt-00000001.h5", "r+") as f:
            f["model/weight"][0, 0] = 9.0  # a silent corruption
    dist.barrier()
    model = part_model(0.0, 0)
    with pytest.raises(sn.CheckpointError, match=f"none of the 1 checkpoints in checkpoint "
                                                  f"directory {shared} verifies") as info:
        checkpoint.resume(shared, model)
    assert "corrupt" in str(info.value) and "use another directory" in str(info.value)
    np.testing.assert_array_equal(model.weight.array, 0.0)


def test_an_intact_checkpoint_of_another_layout_is_refused_not_skipped(shared):
    if dist.size() % 2:
        pytest.skip("tp=2 needs an even number of ranks")
    with dist.Mesh(tp=2) as mesh:
        sn.save_checkpoint(shared + "/", part_model(1.0, mesh.tp_rank), step=1, mesh=mesh)
    sn.save_checkpoint(shared + "/", part_model(2.0, 0), step=2)  # then a tp=1 run
    with dist.Mesh(tp=2) as mesh:
        model = part_model(0.0, 0)
        with pytest.raises(sn.CheckpointError, match=r"ckpt-00000002.h5 \(step 2\) was "
                                                      r"written by layout .*'tp': 1.*this job "
                                                      r"is .*'tp': 2"):
            checkpoint.resume(shared, model, mesh=mesh)
        np.testing.assert_array_equal(model.weight.array, 0.0)
