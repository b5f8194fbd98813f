"""Module and optimizer ``zero_grad`` under DataParallel, both modes: a None
gradient (PyTorch's default, ``set_to_none=True``) is written into the
bucket view by the next backward, and zeroing in place keeps the view; every
step's gradients stay bucket views and are the mean over the ranks (a
closed form in ``rank`` and ``size``). Runs at any number of ranks."""
import numpy as np
import pytest

import spmdnet as sn
from spmdnet import dist, nn, optim, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]


def grad(p):
    return None if p.grad is None else np.asarray(p.grad)


ZERO_GRADS = {
    "module, set_to_none": lambda ddp, opt: ddp.module.zero_grad(),
    "module, in place": lambda ddp, opt: ddp.module.zero_grad(set_to_none=False),
    "wrapper, set_to_none": lambda ddp, opt: ddp.zero_grad(),
    "optimizer, set_to_none": lambda ddp, opt: opt.zero_grad(),
    "optimizer, in place": lambda ddp, opt: opt.zero_grad(set_to_none=False),
}


@pytest.mark.parametrize("mode", sorted(ZERO_GRADS))
def test_zero_grad_keeps_gradients_in_the_buckets(mode):
    model = nn.Sequential(nn.Linear(1, 4, bias=False), nn.Linear(4, 3))
    ddp = parallel.DataParallel(model, bucket_mb=0.00001)  # one bucket per parameter
    opt = optim.SGD(ddp.parameters(), lr=0.0)  # lr 0: the closed form holds every step
    w0, w1 = model[0].weight.numpy(), model[1].weight.numpy()
    x = sn.tensor(np.array([[float(dist.rank() + 1)]]))  # d(sum)/d(w0) = (1 + rank) * w1 col sums
    mean_x = (dist.size() + 1) / 2
    for step in range(3):
        ZERO_GRADS[mode](ddp, opt)
        in_place = "in place" in mode and step > 0
        assert all((grad(p) is not None) == in_place for p in model.parameters())
        if in_place:
            assert all(not grad(p).any() for p in model.parameters())
        ddp(x).sum().backward()
        for bucket in ddp.buckets:
            for p in bucket.params:
                assert np.shares_memory(grad(p), bucket.buffer), (mode, step)
        np.testing.assert_allclose(grad(model[0].weight), mean_x * w1.sum(0)[:, None],
                                   rtol=1e-13)
        np.testing.assert_allclose(grad(model[1].weight),
                                   np.tile(mean_x * w0[:, 0], (3, 1)), rtol=1e-13)
        np.testing.assert_array_equal(grad(model[1].bias), np.ones(3))
        opt.step()
    ddp.close()
