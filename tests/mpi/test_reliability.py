"""Collective check mode, the non-finite guard and collective checkpoint
errors: every rank raises the same error, nobody hangs."""
import hashlib
import time

import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel
from tests.helpers.check_mode import collective_check_mode
from tests.helpers.shared_dirs import shared_directory

pytestmark = pytest.mark.mpi


@pytest.fixture
def debug_collectives(monkeypatch):
    with collective_check_mode(monkeypatch):
        yield


def test_check_mode_catches_a_shape_mismatch(debug_collectives):
    if dist.size() == 1:
        pytest.skip("needs two ranks")
    x = np.zeros(3 if dist.rank() != 1 else 4)
    with pytest.raises(sn.DistributedError) as info:
        dist.allreduce(x)
    msg = str(info.value)
    assert "rank 1 differs" in msg and "shape (4,)" in msg and "shape (3,)" in msg
    assert "test_reliability.py" in msg  # call sites in the table


def test_check_mode_catches_a_skipped_collective(debug_collectives):
    if dist.size() == 1:
        pytest.skip("needs two ranks")
    x = np.ones(2)
    with pytest.raises(sn.DistributedError, match="broadcast"):
        if dist.rank() != 1:
            dist.allreduce(x)  # rank 1 skips this one ...
        dist.bcast(x)          # ... and arrives here instead


def test_check_mode_passes_matching_collectives(debug_collectives):
    x = np.full(5, float(dist.rank()))
    dist.allreduce(x)
    assert x[0] == sum(range(dist.size()))


def replicas_hash(model):
    h = hashlib.sha256(b"".join(p.array.tobytes() for p in model.parameters())).hexdigest()
    return MPI.COMM_WORLD.allgather(h)


def nan_step(mode):
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    ddp = parallel.DataParallel(model, nonfinite=mode, bucket_mb=0.00005)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = np.ones((2, 3), np.float32)
    if dist.rank() == dist.size() - 1:
        x[0, 0] = np.nan  # the last rank's data is broken
    before = [p.array.copy() for p in model.parameters()]
    loss = F.cross_entropy(ddp(sn.tensor(x)), np.array([0, 1]))
    opt.zero_grad()
    return ddp, model, opt, loss, before


def test_nonfinite_raise_names_rank_parameter_step():
    ddp, model, opt, loss, _ = nan_step("raise")
    with pytest.raises(sn.errors.NonFiniteError) as info:
        loss.backward()
    msg = str(info.value)
    assert f"rank {dist.size() - 1} parameter '0.weight'" in msg and "step 0" in msg
    assert len(set(replicas_hash(model))) == 1
    ddp.close()


def test_nonfinite_skip_skips_the_step_everywhere():
    ddp, model, opt, loss, before = nan_step("skip")
    loss.backward()
    assert all(p.grad is None for p in model.parameters())
    opt.step()  # a no-op: no gradients
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.array, b)
    assert ddp.skipped_steps == 1 and len(set(replicas_hash(model))) == 1
    # the next, healthy step goes through
    out = ddp(sn.tensor(np.ones((2, 3), np.float32)))
    F.cross_entropy(out, np.array([0, 1])).backward()
    assert all(p.grad is not None and np.isfinite(p.grad).all() for p in model.parameters())
    ddp.close()


def test_checkpoint_restores_each_ranks_rng(tmp_path_factory):
    directory = shared_directory(tmp_path_factory, "ckpt")
    sn.manual_seed(100 + dist.rank())  # a different stream per rank
    model = nn.Linear(2, 2)
    path = sn.save_checkpoint(directory + "/", model, step=1)
    expected = sn.rand(4).numpy()
    sn.manual_seed(0)
    sn.load_checkpoint(path, model)
    np.testing.assert_array_equal(sn.rand(4).numpy(), expected)


def test_incompatible_checkpoint_raises_on_every_rank(tmp_path_factory):
    directory = shared_directory(tmp_path_factory, "ckpt")
    path = sn.save_checkpoint(directory + "/c.h5", nn.Linear(2, 3), step=4)
    with pytest.raises(sn.CheckpointError, match="does not fit the model"):
        sn.load_checkpoint(path, nn.Linear(2, 5))


def test_corrupt_on_one_rank_raises_on_every_rank(tmp_path_factory):
    directory = shared_directory(tmp_path_factory, "ckpt")
    good = sn.save_checkpoint(directory + "/good.h5", nn.Linear(2, 3), step=4)
    path = good if dist.rank() != dist.size() - 1 else directory + "/missing.h5"
    with pytest.raises(sn.CheckpointError, match=f"rank {dist.size() - 1}"):
        sn.load_checkpoint(path, nn.Linear(2, 3))


def test_check_mode_leaves_groups_running_different_collectives_alone(debug_collectives):
    if dist.size() % 2:
        pytest.skip("needs an even number of ranks")
    with dist.Mesh(tp=2) as mesh:
        x = np.ones(3)
        if mesh.dp_rank == 0:  # one TP group reduces twice ...
            dist.allreduce(x, comm=mesh.tp)
            dist.allreduce(x, comm=mesh.tp)
        else:                  # ... the other broadcasts, late, then gathers
            time.sleep(1.5)
            dist.bcast(x, comm=mesh.tp)
            dist.allgather(x, comm=mesh.tp)
        dist.barrier()
    assert x[0] == (4.0 if mesh.dp_rank == 0 else 1.0)  # each group ran its own collectives


def test_check_mode_waits_for_a_late_member(debug_collectives):
    if dist.rank() == 0:
        time.sleep(1.5)  # longer than the grace period: busy is no mismatch
    x = np.ones(2)
    dist.allreduce(x)
    assert x[0] == dist.size()
