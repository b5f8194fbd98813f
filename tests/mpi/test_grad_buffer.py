"""The parameter-and-gradient buffer under DataParallel and ZeRO
(``parallel._common.grad_buffer``): its layout (flat storage per dtype,
DDP's bucket sizes in reverse registration order), the flat arrays a fused
optimizer can step on, its placements and storage claims, and the mean it
delivers (against the serial sum of every rank's gradient, float64)."""
import numpy as np
import pytest

import spmdnet as sn
from spmdnet import dist, nn, parallel
from spmdnet.autograd.grad_placement import has_placement
from spmdnet.parallel._common.grad_buffer import ParamAndGradBuffer
from spmdnet.parallel._common.reductions import AllReduce

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]

MB = 1024 * 1024


def big_model():
    # float64 weights of 0.5 MB, 2 MB and 0.5 MB (+ biases of 2, 8 and 0.5 kB)
    sn.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 1024), nn.Linear(1024, 64))


def test_buckets_follow_ddps_sizes_in_reverse_registration_order():
    model = big_model()
    params = list(model.parameters())
    buf = ParamAndGradBuffer(params, [n for n, _ in model.named_parameters()],
                             dist.world().comm, who="test", reduction=AllReduce(1),
                             bucket_mb=3.0, mode="none")
    index = {id(p): i for i, p in enumerate(params)}
    groups = [[index[id(p)] for p in b.params] for b in buf.buckets]
    # backward's order: the first bucket stops below 1 MB (last layer + the middle bias,
    # 520.5 kB: the 2 MB weight would overflow it), the next below 3 MB (2.5 MB)
    assert groups == [[5, 4, 3], [2, 1, 0]]
    assert buf.buckets[0].nbytes <= 1 * MB and all(b.nbytes <= 3 * MB for b in buf.buckets)
    flat = buf.grad_flats[np.dtype(np.float64)]
    assert flat.size == sum(p.array.size for p in params)
    for b in buf.buckets:  # each bucket a contiguous range of the dtype's flat gradient
        assert np.shares_memory(b.buffer, flat) and b.buffer.size == b.stop - b.start
    assert all(has_placement(p) for p in params)
    buf.close()
    assert not any(has_placement(p) for p in params)


class TwoDtypes(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 4), nn.Linear(3, 2).float()

    def forward(self, x):
        return self.a(x).tanh().sum() + self.b(x.float()).sum().double()


def test_the_flat_gradient_is_every_grad_in_registration_order_after_the_mean():
    model = TwoDtypes()  # two dtypes: one flat array each
    ddp = parallel.DataParallel(model, bucket_mb=0.00005)
    rng = np.random.default_rng(dist.rank())
    x = rng.standard_normal((5, 3))
    ddp(sn.tensor(x)).backward()
    flats = ddp.buffer.grad_flats
    assert sorted(str(d) for d in flats) == ["float32", "float64"]
    for dtype, flat in flats.items():
        mine = [p for p in model.parameters() if p.dtype == dtype]
        np.testing.assert_array_equal(flat, np.concatenate([p.grad.numpy().ravel()
                                                            for p in mine]))
        assert all(np.shares_memory(p.grad.array, flat) for p in mine)
    # the mean over ranks: every rank's local gradient, summed serially, / size
    serial = TwoDtypes()
    serial.load_state_dict(model.state_dict())
    for xr in dist.world().comm.allgather(x):
        serial(sn.tensor(xr)).backward()
    for p, q in zip(model.parameters(), serial.parameters()):
        tol = 1e-12 if p.dtype == np.float64 else 1e-5
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy() / dist.size(),
                                   rtol=tol, atol=tol)
    ddp.close()


def test_flat_params_are_claimed_views_until_close():
    model = nn.Linear(3, 2)
    params = list(model.parameters())
    buf = ParamAndGradBuffer(params, ["weight", "bias"], dist.world().comm, who="a test",
                             parts=dist.size(), flat_params=True)
    flat = buf.param_flats[np.dtype(np.float64)]
    assert flat.size == buf.layouts[np.dtype(np.float64)].padded_numel >= 8
    assert all(np.shares_memory(p.array, flat) for p in params)
    with pytest.raises(RuntimeError, match="weight of a test"):
        model.weight.data = sn.zeros(2, 3)
    flat[:6] = 1.0  # one pass over the flat storage updates every parameter
    np.testing.assert_array_equal(model.weight.numpy(), np.ones((2, 3)))
    buf.close()
    model.weight.data = sn.zeros(2, 3)  # the user's again


def test_flat_params_without_claim_are_views_that_data_may_rebind():
    model = nn.Linear(3, 2)
    buf = ParamAndGradBuffer(list(model.parameters()), ["weight", "bias"], dist.world().comm,
                             who="a test", flat_params=True, claim=False)
    flat = buf.param_flats[np.dtype(np.float64)]
    flat[:6] = 2.0
    np.testing.assert_array_equal(model.weight.numpy(), np.full((2, 3), 2.0))
    model.weight.data = sn.zeros(2, 3)  # not refused: the weight leaves the flat array
    assert not np.shares_memory(model.weight.array, flat)
    np.testing.assert_array_equal(flat[:6], np.full(6, 2.0))
    buf.close()
