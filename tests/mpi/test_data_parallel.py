"""DataParallel against the serial oracle: N ranks with local batch b equal
one process with batch N*b, replicas stay bitwise identical, no_sync and
unused parameters behave, mismatched models fail on every rank."""
import hashlib

import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, parallel
from tests.helpers.oracles import OPTIMIZERS, train_step

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
LOCAL = 3  # samples per rank


def make_model(seed=0):
    sn.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 6), nn.ReLU(),
                         nn.Linear(6, 3))


def global_batch(step):
    rng = np.random.default_rng(100 + step)
    n = LOCAL * dist.size()
    return rng.standard_normal((n, 5)), rng.integers(0, 3, n)


def local_slice(x):
    r = dist.rank()
    return x[r * LOCAL:(r + 1) * LOCAL]


def params_hash(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(np.ascontiguousarray(p.array).tobytes())
    return h.hexdigest()


def assert_replicas_identical(model):
    hashes = MPI.COMM_WORLD.allgather(params_hash(model))
    assert len(set(hashes)) == 1, f"replicas differ: {hashes}"


@pytest.mark.parametrize("overlap", ["nonblocking", "thread", "none"])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("bucket_mb", [25.0, 0.0005])  # one bucket; many tiny buckets
def test_equals_serial_large_batch(opt_name, overlap, bucket_mb):
    serial = make_model()
    serial_opt = OPTIMIZERS[opt_name](serial.parameters())
    model = make_model(seed=dist.rank())  # different init: the wrap must broadcast
    ddp = parallel.DataParallel(model, bucket_mb=bucket_mb, overlap=overlap)
    opt = OPTIMIZERS[opt_name](ddp.parameters())
    for step in range(6):
        x, y = global_batch(step)
        train_step(ddp, opt, local_slice(x), local_slice(y))
        train_step(serial, serial_opt, x, y)
        for (name, p), q in zip(model.named_parameters(), serial.parameters()):
            np.testing.assert_allclose(p.array, q.array, rtol=1e-10, atol=1e-12,
                                       err_msg=f"step {step} {name}")
        assert_replicas_identical(model)
    ddp.close()


def test_gradient_is_exact_mean_of_ranks():
    layer = nn.Linear(1, 4, bias=False)
    ddp = parallel.DataParallel(layer, bucket_mb=0.00001)
    for _ in range(3):
        layer.zero_grad()
        out = ddp(sn.tensor(np.array([[float(dist.rank())]])))
        out.sum().backward()  # d/dw = rank
        np.testing.assert_array_equal(layer.weight.grad, np.full((4, 1), (dist.size() - 1) / 2))
    ddp.close()


def test_grads_are_views_into_buckets():
    model = make_model()
    ddp = parallel.DataParallel(model, bucket_mb=0.0005)
    x, y = global_batch(0)
    F.cross_entropy(ddp(sn.tensor(local_slice(x))), local_slice(y)).backward()
    assert len(ddp.buckets) > 1
    for bucket in ddp.buckets:
        for p in bucket.params:
            assert np.shares_memory(p.grad.array, bucket.buffer)
    ddp.close()


class CountingReduction:
    """The buffer's comm hook, counting the collectives it starts and lands."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def start(self, bc, bucket):
        self.calls += 1
        return self.inner.start(bc, bucket)

    def land(self, bucket):
        self.calls += 1
        self.inner.land(bucket)

    def finished(self):
        self.inner.finished()


def test_no_sync_accumulates_locally_then_reduces_the_sum():
    serial, model = make_model(), make_model()
    ddp = parallel.DataParallel(model, bucket_mb=0.0005)
    ddp.buffer.reduction = counter = CountingReduction(ddp.buffer.reduction)
    (x1, y1), (x2, y2) = global_batch(1), global_batch(2)
    with ddp.no_sync():
        F.cross_entropy(ddp(sn.tensor(local_slice(x1))), local_slice(y1)).backward()
    assert counter.calls == 0  # no communication inside no_sync
    local_grad = model[0].weight.grad.numpy()
    everyone = MPI.COMM_WORLD.allgather(local_grad)
    if dist.size() > 1:
        assert not np.allclose(everyone[0], everyone[1])  # still local
    F.cross_entropy(ddp(sn.tensor(local_slice(x2))), local_slice(y2)).backward()
    assert counter.calls > 0
    loss = F.cross_entropy(serial(sn.tensor(x1)), y1) + F.cross_entropy(serial(sn.tensor(x2)), y2)
    loss.backward()
    for p, q in zip(model.parameters(), serial.parameters()):
        np.testing.assert_allclose(p.grad, q.grad, rtol=1e-10, atol=1e-13)
    ddp.close()


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head_a, self.head_b = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x, use_b):
        h = self.body(x).tanh()
        return self.head_b(h) if use_b else self.head_a(h)


def test_unused_parameters_contribute_zeros():
    sn.manual_seed(3)
    model = TwoHeads()
    sn.manual_seed(3)
    serial = TwoHeads()
    ddp = parallel.DataParallel(model, bucket_mb=0.0001)
    x = np.random.default_rng(0).standard_normal((dist.size(), 4))
    use_b = dist.rank() == 0  # only rank 0 uses head_b; the others use head_a
    ddp(sn.tensor(x[dist.rank():dist.rank() + 1]), use_b).sum().backward()
    # oracle: sum of every rank's loss, divided by the number of ranks
    total = sum(serial(sn.tensor(x[r:r + 1]), r == 0).sum() for r in range(dist.size()))
    (total / dist.size()).backward()
    for (name, p), q in zip(model.named_parameters(), serial.parameters()):
        want = q.grad if q.grad is not None else np.zeros_like(q.array)
        np.testing.assert_allclose(p.grad, want, rtol=1e-12, atol=1e-14, err_msg=name)
    ddp.close()


def test_mismatched_models_raise_on_every_rank():
    if dist.size() == 1:
        pytest.skip("needs two ranks")
    out = 5 if dist.rank() == 1 else 4
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, out))
    with pytest.raises(sn.DistributedError) as info:
        parallel.DataParallel(model)
    msg = str(info.value)
    assert "'2.weight'" in msg and "(4, 4)" in msg and "(5, 4)" in msg and "rank 1" in msg


def test_allreduce_gradients_explicit():
    model = make_model()
    x, y = global_batch(3)
    parallel.allreduce_gradients(model.parameters())  # no grads yet: zeros, no hang
    model.zero_grad()
    F.cross_entropy(model(sn.tensor(local_slice(x))), local_slice(y)).backward()
    parallel.allreduce_gradients(model.parameters())
    serial = make_model()
    F.cross_entropy(serial(sn.tensor(x)), y).backward()
    for p, q in zip(model.parameters(), serial.parameters()):
        np.testing.assert_allclose(p.grad, q.grad, rtol=1e-10, atol=1e-13)
