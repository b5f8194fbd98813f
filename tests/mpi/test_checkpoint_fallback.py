"""Checkpoint faults of the newer strategies (issue 26, items 2, 8 and 10):
a damaged rank's part of a tensor/pipeline-parallel checkpoint makes every
rank fall back to the same older one, saying what was skipped; a read that
fails on one rank of an FSDP job is raised on every rank before any
collective; an FSDP optimizer state is refused by DataParallel + AdamW
before anything is loaded."""
import logging
from pathlib import Path

import h5py
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import checkpoint, dist, nn, optim, parallel
from tests.helpers.shared_dirs import shared_checkpoint_directory

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture
def shared(tmp_path_factory, monkeypatch):
    return shared_checkpoint_directory(tmp_path_factory, monkeypatch)


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def logged():
    """The spmdnet logger's warnings (it does not propagate to pytest's caplog)."""
    handler, logger = Collect(), dist.get_logger()
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def part_model(value):
    """A model whose values differ per rank, as a tensor-parallel part does."""
    model = nn.Linear(2, 2)
    for p in model.parameters():
        p.array[...] = value + dist.rank()
    return model


def damage(path, rank):
    if dist.rank() == 0:
        with h5py.File(path, "r+") as f:
            f[f"rank{rank}/model/weight"][0, 0] = 7.0  # a silent corruption of one part
    dist.barrier()


@pytest.mark.parametrize("how", ["resume", "load_checkpoint", "latest_checkpoint"])
def test_damaged_part_falls_back_on_every_rank(shared, how, logged):
    if dist.size() % 2:
        pytest.skip("tp=2 needs an even number of ranks")
    with dist.Mesh(tp=2) as mesh:
        for step in (1, 2):
            sn.save_checkpoint(shared + "/", part_model(10.0 * step), step=step, mesh=mesh)
        last = dist.size() - 1
        damage(Path(shared) / "ckpt-00000002.h5", last)
        model = part_model(0.0)
        if how == "resume":
            step = checkpoint.resume(shared, model, mesh=mesh)["step"]
        elif how == "load_checkpoint":
            step = sn.load_checkpoint(shared, model, mesh=mesh)["step"]
        else:
            found = sn.latest_checkpoint(shared)
            step = 1 if found.endswith("ckpt-00000001.h5") else 2
        assert step == 1
        if how != "latest_checkpoint":
            np.testing.assert_array_equal(model.weight.array, 10.0 + dist.rank())
        if dist.rank() == 0:  # what was skipped, and why, on rank 0
            text = "\n".join(logged)
            assert "ckpt-00000002.h5" in text and "corrupt" in text
            if how != "latest_checkpoint":
                assert f"rank {last}" in text


def test_no_part_verifies_raises_on_every_rank(shared):
    if dist.size() % 2:
        pytest.skip("tp=2 needs an even number of ranks")
    with dist.Mesh(tp=2) as mesh:
        sn.save_checkpoint(shared + "/", part_model(1.0), step=1, mesh=mesh)
        damage(Path(shared) / "ckpt-00000001.h5", 1)
        with pytest.raises(sn.CheckpointError, match="rank 1"):
            sn.load_checkpoint(shared, part_model(0.0), mesh=mesh)


def fsdp_and_adamw():
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    fsdp = parallel.FullyShardedDataParallel(model, wrap={nn.Linear})
    opt = optim.AdamW(fsdp.parameters(), lr=0.01)
    F.cross_entropy(fsdp(sn.tensor(np.ones((2, 3), np.float32))), np.array([0, 1])).backward()
    opt.step()
    return fsdp, opt


def test_fsdp_read_failing_on_one_rank_raises_everywhere(shared):
    fsdp, opt = fsdp_and_adamw()
    good = sn.save_checkpoint(shared + "/c.h5", fsdp, opt, step=3)
    path = good if dist.rank() != dist.size() - 1 else shared + "/missing.h5"
    with pytest.raises(sn.CheckpointError, match=f"rank {dist.size() - 1}.*does not exist"):
        sn.load_checkpoint(path, fsdp, opt)
    assert sn.load_checkpoint(good, fsdp, opt)["step"] == 3  # the collectives still match
    fsdp.close()


def test_fsdp_optimizer_state_refused_by_dataparallel_before_loading(shared):
    fsdp, opt = fsdp_and_adamw()
    path = sn.save_checkpoint(shared + "/fsdp.h5", fsdp, opt, step=5)
    fsdp.close()
    sn.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    ddp = parallel.DataParallel(model)
    adamw = optim.AdamW(model.parameters(), lr=0.01)
    before = [p.array.copy() for p in model.parameters()]
    with pytest.raises(sn.CheckpointError, match="written by FullyShardedDataParallel"):
        sn.load_checkpoint(path, ddp, adamw)
    for p, b in zip(model.parameters(), before):  # nothing was loaded
        np.testing.assert_array_equal(p.array, b)
    assert not adamw.state
    ddp.close()
