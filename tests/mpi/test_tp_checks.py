"""Tensor-parallel input faults (issue 26, items 5 and 6): in check mode,
ranks of one TP group fed different samples raise on every rank of the group,
naming the ranks; a target out of range raises IndexError (as
F.cross_entropy) without any communication."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, parallel
from tests.helpers.check_mode import collective_check_mode

pytestmark = pytest.mark.mpi
tp = parallel.tensor_parallel


@pytest.fixture
def debug_collectives(monkeypatch):
    with collective_check_mode(monkeypatch):
        yield


@pytest.fixture
def mesh():
    if dist.size() % 2:
        pytest.skip("tp=2 needs an even number of ranks")
    with dist.Mesh(tp=2) as m:
        yield m


def no_communication(*args, **kwargs):
    raise AssertionError("communicated before checking the targets")


@pytest.mark.parametrize("bad", [6, -1, 100])
def test_vocab_parallel_cross_entropy_target_out_of_range(mesh, monkeypatch, bad):
    logits = sn.tensor(np.zeros((3, 3)), requires_grad=True)  # vocabulary 6 over tp=2
    target = np.array([0, bad, 5])
    with pytest.raises(IndexError) as serial:  # the oracle: the serial loss's error type
        F.cross_entropy(sn.tensor(np.zeros((3, 6))), target)
    monkeypatch.setattr(dist, "allreduce", no_communication)
    with pytest.raises(IndexError, match=f"target {bad} is out of bounds \\[0, 6\\)"):
        tp.vocab_parallel_cross_entropy(logits, target, mesh.tp)
    assert str(bad) in str(serial.value)


def test_vocab_parallel_cross_entropy_ignore_index_stays_allowed(mesh):
    logits = sn.tensor(np.zeros((2, 3)), requires_grad=True)
    loss = tp.vocab_parallel_cross_entropy(logits, np.array([-100, 4]), mesh.tp)
    assert abs(loss.item() - np.log(6)) < 1e-12  # uniform logits: log V for the one counted


def test_check_mode_names_tp_ranks_fed_different_samples(mesh, debug_collectives):
    sn.manual_seed(0)
    layer = tp.ColumnParallelLinear(4, 6, mesh.tp)
    x = np.full((2, 4), 1.0 + mesh.tp_rank, np.float32)  # a sampler over the world: differ
    with pytest.raises(sn.DistributedError) as info:
        layer(sn.tensor(x))
    msg = str(info.value)
    assert "rank 1 (world rank" in msg and "differ from rank 0" in msg
    assert "test_tp_checks.py" in msg and "mesh.dp" in msg


def test_check_mode_names_tp_ranks_fed_different_tokens(mesh, debug_collectives):
    sn.manual_seed(0)
    emb = tp.VocabParallelEmbedding(8, 3, mesh.tp)
    with pytest.raises(sn.DistributedError, match="token ids of VocabParallelEmbedding"):
        emb(np.array([[1, 2 + mesh.tp_rank]]))


def test_check_mode_passes_the_same_samples(mesh, debug_collectives):
    sn.manual_seed(0)
    layer = tp.ColumnParallelLinear(4, 6, mesh.tp, gather_output=True)
    x = np.random.default_rng(mesh.dp_rank).standard_normal((2, 4)).astype(np.float32)
    out = layer(sn.tensor(x))
    assert out.shape == (2, 6)
