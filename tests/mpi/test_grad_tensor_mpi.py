""".grad is a Tensor under DataParallel and ZeRO: one Tensor per parameter,
made once, whose .array is a view into its gradient bucket, through steps,
zero_grad (both modes), no_sync, clipping and assigned gradients."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel
from spmdnet.autograd.grad_placement import grad_home
from tests.mpi.test_zero import make_model

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]


def batch(step):
    rng = np.random.default_rng(10 * step + dist.rank())
    return sn.tensor(rng.standard_normal((4, 5))), rng.integers(0, 3, 4)


def assert_grads_home(ddp, homes):
    for bucket in ddp.buckets:
        for p in bucket.params:
            assert p.grad is homes[id(p)] and p.grad is grad_home(p)
            assert isinstance(p.grad, sn.Tensor)
            assert np.shares_memory(p.grad.array, bucket.buffer)


def assert_replicas_equal(arrays):
    for a in arrays:
        np.testing.assert_array_equal(dist.bcast(a.copy()), a)


# each step: how it zeroes, whether it accumulates a no_sync micro-batch first, and clipping
STEPS = [("opt.zero_grad()", False, None), ("zero_grad(set_to_none=False)", False, 0.05),
         ("model.zero_grad()", True, 0.05), ("opt.zero_grad()", True, None),
         ("zero_grad(set_to_none=False)", True, 1e-3)]


def test_grads_stay_bucket_views_through_steps_no_sync_and_clipping():
    model = make_model()
    ddp = parallel.DataParallel(model, bucket_mb=0.0002)
    assert len(ddp.buckets) > 1
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    homes = {id(p): grad_home(p) for p in model.parameters()}
    for step, (zero, micro, clip) in enumerate(STEPS):
        if zero == "opt.zero_grad()":
            opt.zero_grad()
        elif zero == "model.zero_grad()":
            model.zero_grad()
        else:
            opt.zero_grad(set_to_none=False)
            assert_grads_home(ddp, homes)
            assert all(not p.grad.array.any() for p in model.parameters())
        if micro:
            with ddp.no_sync():
                x, y = batch(100 + step)
                F.cross_entropy(ddp(x), y).backward()
            assert_grads_home(ddp, homes)  # local gradients, already in the bucket
        x, y = batch(step)
        F.cross_entropy(ddp(x), y).backward()
        assert_grads_home(ddp, homes)
        assert_replicas_equal([b.buffer for b in ddp.buckets])
        if clip is not None:
            before = [b.buffer.copy() for b in ddp.buckets]
            total = nn.utils.clip_grad_norm_(model.parameters(), clip)
            assert total > clip
            assert_grads_home(ddp, homes)
            for b, old in zip(ddp.buckets, before):  # clipping wrote the buckets
                np.testing.assert_allclose(b.buffer, old * clip / (total + 1e-6), rtol=1e-12)
            after = np.sqrt(sum(float((p.grad.array ** 2).sum()) for p in model.parameters()))
            assert after == pytest.approx(clip, rel=1e-5)
        opt.step()
        assert_replicas_equal([p.array for p in model.parameters()])
    ddp.close()


@pytest.mark.parametrize("assign", [
    lambda p, v: setattr(p, "grad", v),                       # an array
    lambda p, v: setattr(p, "grad", sn.Tensor(v)),            # a Tensor
    lambda p, v: setattr(p.grad, "data", v)],                 # the home Tensor's .data
    ids=["array", "tensor", "data"])
def test_assigned_gradient_is_brought_home_and_reduced(assign):
    layer = nn.Linear(1, 4, bias=False)
    ddp = parallel.DataParallel(layer, bucket_mb=0.0001)
    home = grad_home(layer.weight)
    ddp(sn.tensor(np.array([[1.0]]))).sum().backward()  # d/dw = 1 on every rank
    assert layer.weight.grad is home
    assign(layer.weight, np.full((4, 1), float(dist.rank())))
    ddp(sn.tensor(np.array([[2.0]]))).sum().backward()  # accumulates 2 onto rank
    assert layer.weight.grad is home and home.array is ddp.buckets[0].views[0]
    assert np.shares_memory(home.array, ddp.buckets[0].buffer)
    np.testing.assert_array_equal(home.array, np.full((4, 1), (dist.size() - 1) / 2 + 2.0))
    ddp.close()


def test_zero_over_data_parallel_keeps_bucket_views():
    model = make_model()
    ddp = parallel.DataParallel(model, bucket_mb=0.0002)
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.Adam,
                                          lr=0.01)
    homes = {id(p): grad_home(p) for p in model.parameters()}
    shard_grad = None
    for step in range(3):
        zo.zero_grad(set_to_none=step != 1)
        x, y = batch(step)
        F.cross_entropy(ddp(x), y).backward()
        assert_grads_home(ddp, homes)
        zo.step()
        if shard_grad is None:
            shard_grad = zo.shard_param.grad
        assert zo.shard_param.grad is shard_grad and shard_grad.array is zo.grad_shard
        assert_replicas_equal([p.array for p in model.parameters()])
    ddp.close()
