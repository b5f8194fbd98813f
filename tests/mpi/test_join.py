"""DataParallel.join(): ranks with different numbers of batches all finish,
and hold the parameters of PyTorch's semantics (each step's gradient is the
sum over the ranks still training divided by the initial number of ranks)."""
import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, parallel
from tests.helpers.oracles import OPTIMIZERS

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
BATCHES = [2, 4, 1, 3, 2, 5]  # batches of rank r: uneven, the last to finish not rank 0


def make_model():
    sn.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def batch(rank, step):
    rng = np.random.default_rng(1000 * rank + step)
    return rng.standard_normal((3, 4)), rng.integers(0, 3, 3)


def loss_of(model, rank, step):
    x, y = batch(rank, step)
    return F.cross_entropy(model(sn.tensor(x)), y)


def oracle(size, opt_name):
    """One process: at step t, sum the gradients of the ranks with a batch t, / size."""
    model = make_model()
    opt = OPTIMIZERS[opt_name](model.parameters())
    counts = BATCHES[:size]
    for step in range(max(counts)):
        opt.zero_grad()
        for r in range(size):
            if step < counts[r]:
                loss_of(model, r, step).backward()
        for p in model.parameters():
            p.grad *= 1.0 / size
        opt.step()
    return model


@pytest.mark.parametrize("overlap", ["nonblocking", "none"])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_uneven_batches_under_join_equal_the_oracle(opt_name, overlap):
    size, rank = dist.size(), dist.rank()
    if size > len(BATCHES):
        pytest.skip(f"the test has batch counts for {len(BATCHES)} ranks")
    model = make_model()
    ddp = parallel.DataParallel(model, bucket_mb=0.0002, overlap=overlap,
                                nonfinite="raise")
    opt = OPTIMIZERS[opt_name](ddp.parameters())
    with ddp.join():
        for step in range(BATCHES[rank]):
            loss = loss_of(ddp, rank, step)
            opt.zero_grad()
            loss.backward()
            opt.step()
    expected = oracle(size, opt_name)
    for (name, p), q in zip(model.named_parameters(), expected.parameters()):
        np.testing.assert_allclose(p.array, q.array, rtol=1e-12, atol=1e-14, err_msg=name)
    assert ddp.steps == max(BATCHES[:size])  # the shadows counted their steps too
    # and the next, even epoch runs as usual
    loss = loss_of(ddp, rank, 99)
    loss.backward()
    ddp.close()


def test_join_with_even_batches_is_plain_data_parallel():
    model = make_model()
    ddp = parallel.DataParallel(model)
    opt = OPTIMIZERS["sgd_momentum"](ddp.parameters())
    with ddp.join():
        for step in range(2):
            loss = loss_of(ddp, dist.rank(), step)
            opt.zero_grad()
            loss.backward()
            opt.step()
    hashes = MPI.COMM_WORLD.allgather(b"".join(p.array.tobytes() for p in model.parameters()))
    assert len(set(hashes)) == 1
    ddp.close()
