"""Pipeline faults (issue 26, items 1 and 18): a stage that runs out of
batches while another waits for it in a send or receive is reported by the
collective check mode within seconds, naming both places; receive anchors
live in the stage's array module."""
import time

import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import backend, dist, nn, parallel
from spmdnet.distributed.p2p_arrays import recv_array
from tests.helpers.check_mode import collective_check_mode

pytestmark = pytest.mark.mpi
REPORTED_WITHIN_S = 15.0  # the watchdog alone would speak after 300 s


@pytest.fixture
def debug_collectives(monkeypatch):
    with collective_check_mode(monkeypatch):
        yield


def two_stage_pipeline(comm):
    sn.manual_seed(0)
    return parallel.Pipeline(nn.Linear(3, 3), comm, micro_batches=1)


def batch():
    return np.ones((2, 3), np.float32), np.array([0, 1])


def test_a_stage_in_a_collective_while_the_other_receives(debug_collectives):
    if dist.size() != 2:
        pytest.skip("a two-stage pipeline over two ranks")
    pp, world = dist.dup(MPI.COMM_WORLD), dist.dup(MPI.COMM_WORLD)
    pipe = two_stage_pipeline(pp)
    t0 = time.time()
    with pytest.raises(sn.DistributedError) as info:
        if dist.rank() == 0:  # sends its activation, then waits for the gradient
            pipe.train_step(*batch(), F.cross_entropy)
        else:                 # the last stage ran out of batches: the epoch's allreduce
            dist.allreduce(np.ones(1), comm=world)
    assert time.time() - t0 < REPORTED_WITHIN_S
    msg = str(info.value)
    assert "allreduce" in msg and "recv(tag" in msg and "test_pipeline_checks.py" in msg
    if dist.rank() == 1:  # take the activation stage 0 sent, so no message outlives pp
        recv_array(pp, 0, parallel.pipeline.gpipe.TAG_FORWARD)
    dist.free(pp)
    dist.free(world)


def test_both_stages_receiving_is_reported(debug_collectives):
    if dist.size() != 2:
        pytest.skip("two ranks")
    pp = dist.dup(MPI.COMM_WORLD)
    peer = 1 - dist.rank()
    t0 = time.time()
    with pytest.raises(sn.DistributedError, match="cannot match"):
        recv_array(pp, peer, tag=99)  # each waits for the other
    assert time.time() - t0 < REPORTED_WITHIN_S
    dist.free(pp)


def test_check_mode_lets_a_slow_healthy_pipeline_run(debug_collectives):
    if dist.size() != 2:
        pytest.skip("two ranks")
    pp = dist.dup(MPI.COMM_WORLD)
    pipe = two_stage_pipeline(pp)
    if dist.rank() == 1:
        time.sleep(1.5)  # longer than the grace period: a slow stage is no deadlock
    loss = pipe.train_step(*batch(), F.cross_entropy)
    assert np.isfinite(loss)
    dist.allreduce(np.ones(1))  # the world's collectives still match afterwards
    dist.free(pp)


def test_receive_anchors_use_the_stages_array_module():
    cp = pytest.importorskip("cupy")
    if dist.size() != 2 or not backend.gpu_count():
        pytest.skip("two ranks and a GPU")
    pp = dist.dup(MPI.COMM_WORLD)
    sn.manual_seed(0)
    stage = nn.Linear(3, 3).to("cuda")
    pipe = parallel.Pipeline(stage, pp, micro_batches=1)
    x, y = batch()
    loss = pipe.train_step(cp.asarray(x), cp.asarray(y), F.cross_entropy)
    assert np.isfinite(loss)
    assert all(isinstance(p.grad.array, cp.ndarray) for p in stage.parameters())
    dist.free(pp)
