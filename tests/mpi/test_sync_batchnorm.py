"""SyncBatchNorm against BatchNorm on the gathered batch (outputs, input and
weight gradients, running statistics), with equal and unequal local batches,
over the world and over a subgroup; under DataParallel (and its join) against
one process with BatchNorm on the global batch."""
import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, parallel
from spmdnet.errors import DistributedError

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
UNEQUAL = [2, 4, 1, 3, 5, 2]


def local_batch(rank, n, step=0, shape=(3, 2, 2)):
    rng = np.random.default_rng(100 * rank + step)
    return rng.standard_normal((n,) + shape) * 1.5 + 0.5, rng.standard_normal((n,) + shape)


def reference(batches, seeds):
    """BatchNorm2d on the concatenated batch, loss Σ out·w: (out, dx, gw, gb, bn)."""
    bn = nn.BatchNorm2d(3, momentum=0.3)
    bn.weight.data[...], bn.bias.data[...] = seeds
    x = sn.tensor(np.concatenate([b[0] for b in batches]), requires_grad=True)
    out = bn(x)
    (out * sn.tensor(np.concatenate([b[1] for b in batches]))).sum().backward()
    return out.numpy(), x.grad.numpy(), bn.weight.grad.numpy(), bn.bias.grad.numpy(), bn


def check_against_gathered(comm, sizes):
    """SyncBatchNorm over ``comm``, rank r of it holding ``sizes[r]`` samples."""
    rank, size = comm.Get_rank(), comm.Get_size()
    seeds = (np.array([1.5, -0.5, 2.0]), np.array([0.1, 0.2, -0.3]))
    batches = [local_batch(r, sizes[r]) for r in range(size)]
    bn = nn.SyncBatchNorm(3, momentum=0.3, comm=comm)
    bn.weight.data[...], bn.bias.data[...] = seeds
    x, w = batches[rank]
    xt = sn.tensor(x, requires_grad=True)
    out = bn(xt)
    (out * sn.tensor(w)).sum().backward()
    want_out, want_dx, want_gw, want_gb, ref = reference(batches, seeds)
    lo = sum(sizes[:rank])
    rows = slice(lo, lo + sizes[rank])
    np.testing.assert_allclose(out.numpy(), want_out[rows], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(xt.grad.numpy(), want_dx[rows], rtol=1e-10, atol=1e-12)
    gw = dist.allreduce(bn.weight.grad.numpy().copy(), comm=comm)
    gb = dist.allreduce(bn.bias.grad.numpy().copy(), comm=comm)
    np.testing.assert_allclose(gw, want_gw, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gb, want_gb, rtol=1e-10, atol=1e-12)
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(getattr(bn, name).numpy(), getattr(ref, name).numpy(),
                                   rtol=1e-12, err_msg=name)
    bn.eval()  # eval: the (equal) running statistics, no communication
    np.testing.assert_allclose(bn(sn.tensor(x)).numpy(), ref.eval()(sn.tensor(x)).numpy(),
                               rtol=1e-12)


@pytest.mark.parametrize("sizes", ["equal", "unequal", "one rank empty"])
def test_sync_batchnorm_equals_batchnorm_on_the_gathered_batch(sizes):
    size = dist.size()
    if size > len(UNEQUAL):
        pytest.skip(f"batch sizes for {len(UNEQUAL)} ranks")
    table = {"equal": [3] * size, "unequal": UNEQUAL, "one rank empty": [2, 0, 3, 1, 4, 2]}
    check_against_gathered(MPI.COMM_WORLD, table[sizes])


def test_convert_keeps_parameters_buffers_and_mode():
    bn = nn.BatchNorm2d(3)
    bn.running_mean.data[...] = 2.0
    bn.eval()
    sync = nn.SyncBatchNorm.convert_sync_batchnorm(bn, process_group=MPI.COMM_WORLD)
    assert isinstance(sync, nn.SyncBatchNorm) and not sync.training
    assert sync.weight is bn.weight and sync.running_mean is bn.running_mean
    assert sync.group_comm() is MPI.COMM_WORLD
    assert list(sync.state_dict()) == list(bn.state_dict())


@pytest.mark.mpi(min_size=2)
def test_sync_batchnorm_over_a_subgroup():
    sub = MPI.COMM_WORLD.Split(dist.rank() % 2, dist.rank())
    try:
        check_against_gathered(sub, UNEQUAL[dist.rank() % 2::2])
    finally:
        sub.Free()


def make_model(sync, comm=None):
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, momentum=0.2), nn.Tanh(),
                          nn.Linear(6, 3))
    return nn.SyncBatchNorm.convert_sync_batchnorm(model, comm=comm) if sync else model


def data(rank, step, n=3):
    rng = np.random.default_rng(1000 * rank + step)
    return rng.standard_normal((n, 4)), rng.integers(0, 3, n)


def serial_steps(size, counts, steps):
    """One process: at step t, BatchNorm over the batches of the ranks with a
    batch t; the gradient is Σ of their mean losses / size (DataParallel's)."""
    model = make_model(sync=False)
    opt = sn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        active = [r for r in range(size) if step < counts[r]]
        batches = [data(r, step) for r in active]
        out = model(sn.tensor(np.concatenate([b[0] for b in batches])))
        loss, lo = 0.0, 0
        for x, y in batches:
            loss = loss + F.cross_entropy(out[lo:lo + len(x)], y)
            lo += len(x)
        opt.zero_grad()
        (loss * (1.0 / size)).backward()
        opt.step()
    return model


def compare(model, expected):
    for (name, a), b in zip(model.state_dict().items(), expected.state_dict().values()):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12,
                                   err_msg=name)


def test_data_parallel_with_sync_batchnorm_equals_one_process_on_the_global_batch():
    size, rank = dist.size(), dist.rank()
    model = make_model(sync=True)
    ddp = parallel.DataParallel(model)
    opt = sn.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        x, y = data(rank, step)
        opt.zero_grad()
        F.cross_entropy(ddp(sn.tensor(x)), y).backward()
        opt.step()
    compare(model, serial_steps(size, [3] * size, 3))
    ddp.close()


def test_join_with_sync_batchnorm_and_uneven_batch_counts():
    size, rank = dist.size(), dist.rank()
    counts = [2, 4, 1, 3, 2, 5][:size]
    model = make_model(sync=True)
    ddp = parallel.DataParallel(model)
    opt = sn.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    with ddp.join():
        for step in range(counts[rank]):
            x, y = data(rank, step)
            opt.zero_grad()
            F.cross_entropy(ddp(sn.tensor(x)), y).backward()
            opt.step()
    compare(model, serial_steps(size, counts, max(counts)))
    ddp.close()


@pytest.mark.mpi(min_size=2)
def test_sync_batchnorm_group_outside_data_parallel_raises_at_wrap():
    sub = MPI.COMM_WORLD.Split(dist.rank() % 2, dist.rank())
    try:
        with pytest.raises(DistributedError, match="not contained in DataParallel"):
            parallel.DataParallel(make_model(sync=True), comm=sub)  # BN over the world
        parallel.DataParallel(make_model(sync=True, comm=sub), comm=MPI.COMM_WORLD).close()
    finally:
        sub.Free()


@pytest.mark.parametrize("broadcast", [True, False])
def test_plain_batchnorm_buffers_come_from_rank_0(broadcast):
    rank = dist.rank()
    model = make_model(sync=False)
    ddp = parallel.DataParallel(model, broadcast_buffers=broadcast)
    bn = model[1]
    bn.running_mean.data[...] = rank  # ranks drift apart
    x, _ = data(rank, 0)
    ddp(sn.tensor(x)).sum().backward()
    mean = model[0](sn.tensor(x)).numpy().mean(axis=0)
    start = 0.0 if broadcast else rank
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.8 * start + 0.2 * mean, rtol=1e-12)
    ddp.close()
