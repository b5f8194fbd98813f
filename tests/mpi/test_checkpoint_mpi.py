"""Issue 18's checkpoint cases on every rank: a bad directory, a full disk,
NaN parameters and a bad newest checkpoint give the same CheckpointError (or
the same fallback) on all ranks, decided collectively, never a hang."""
import errno
import shutil
from collections import namedtuple
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as sn
from spmdnet import dist, nn, optim
from spmdnet.checkpoint import files as checkpoint_io
from tests.helpers.shared_dirs import shared_checkpoint_directory

pytestmark = pytest.mark.mpi(min_size=2)
Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def shared(tmp_path_factory, monkeypatch):
    return shared_checkpoint_directory(tmp_path_factory, monkeypatch)


def model_and_opt():
    sn.manual_seed(0)
    model = nn.Linear(5, 3)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        opt.state[p] = {"momentum_buffer": np.ones_like(p.array)}
    return model, opt


def listing(directory):
    names = sorted(p.name for p in Path(directory).iterdir())
    return MPI.COMM_WORLD.bcast(names, root=0)


def test_bad_checkpoint_dir_raises_on_every_rank(shared):
    if dist.rank() == 0:
        with open(shared + "/file", "w") as f:
            f.write("x")
    dist.barrier()
    with pytest.raises(sn.CheckpointError, match="file is not usable on rank 0: a file is in"):
        sn.check_checkpoint_dir(shared + "/file")
    assert sn.check_checkpoint_dir(shared + "/ok") == shared + "/ok"


def test_disk_full_before_writing_raises_on_every_rank(shared, monkeypatch):
    model, opt = model_and_opt()
    sn.save_checkpoint(shared + "/", model, opt, step=1)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**6, 10**6 - 10, 10))
    with pytest.raises(sn.CheckpointError, match=r"needs \d+ bytes .*, 10 bytes \(0.0 MiB\) free"):
        sn.save_checkpoint(shared + "/", model, opt, step=2)
    monkeypatch.undo()
    assert listing(shared) == ["ckpt-00000001.h5", "latest"]


def test_disk_full_part_way_raises_on_every_rank(shared, monkeypatch):
    model, opt = model_and_opt()
    sn.save_checkpoint(shared + "/", model, opt, step=1)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(checkpoint_io.os, "write", full)
    with pytest.raises(sn.CheckpointError, match=r"ckpt-00000002.h5 failed on rank 0.*needs"):
        sn.save_checkpoint(shared + "/", model, opt, step=2)
    monkeypatch.undo()
    assert listing(shared) == ["ckpt-00000001.h5", "latest"]  # the temporary removed
    assert sn.load_checkpoint(shared, model, opt)["step"] == 1


def test_nan_on_the_writing_rank_raises_on_every_rank(shared):
    model, opt = model_and_opt()
    if dist.rank() == 0:
        model.bias.data[0] = np.inf
    with pytest.raises(sn.CheckpointError, match="parameter 'bias' holds 1 NaN/Inf"):
        sn.save_checkpoint(shared + "/", model, opt, step=1)


def test_resume_falls_back_on_every_rank(shared):
    model, opt = model_and_opt()
    for step in (1, 2):
        sn.save_checkpoint(shared + "/", model, opt, step=step)
    if dist.rank() == 0:
        with h5py.File(shared + "/ckpt-00000002.h5", "r+") as f:
            f["model/weight"][0, 0] = 7.0  # a silent corruption
    dist.barrier()
    assert sn.latest_checkpoint(shared).endswith("ckpt-00000001.h5")
    assert sn.load_checkpoint(shared, model, opt)["step"] == 1
