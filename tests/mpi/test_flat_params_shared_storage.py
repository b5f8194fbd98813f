"""Parameters sharing storage under ``flat_params`` (``parallel._common.grad_buffer``):
copying each parameter into its own view of one flat array would untie two
Parameters whose data is one array (``b.weight.data = a.weight.data``).
DistributedDataParallel (which, like PyTorch's, owns no parameter storage)
keeps them out of the flat array; ZeroRedundancyOptimizer, which needs every
parameter in it, refuses them naming both. Oracles: NumPy's
``may_share_memory`` over every pair, and DDP with ``flat_params=False``
trained bit for bit alongside."""
import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as sn
from spmdnet import dist, nn, optim, parallel
from spmdnet.parallel._common.flat import shared_storage
from spmdnet.parallel._common.grad_buffer import ParamAndGradBuffer

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]


def test_shared_storage_is_every_array_that_may_share_memory_with_another():
    base, other = np.zeros(64), np.zeros((4, 4))
    hand = [base[3:9], base[8:12], base[20:30], base[30:40], base[50:40:-2], base[41:45],
            base[60:61], other.T, other[1:3, 1:3], np.zeros(5), base[0:0], base[7:7]]
    # overlapping: 0-1 (one element), 4-5 (reversed, strided), 7-8 (transposed, 2-D)
    assert sorted(shared_storage(hand)) == [0, 1, 4, 5, 7, 8]
    rng = np.random.default_rng(0)
    arrays = list(hand)
    for lo, n, step in zip(rng.integers(0, 40, 6), rng.integers(1, 8, 6), [1, 2, 3, -1, 1, 2]):
        arrays.append(base[lo:lo + n * abs(step)][::step])
    found = shared_storage(arrays)
    oracle = {i for i, a in enumerate(arrays) for j, b in enumerate(arrays)
              if i != j and a.size and b.size and np.may_share_memory(a, b)}
    assert set(found) == oracle
    for i, j in found.items():  # each names a partner that does share
        assert i != j and np.may_share_memory(arrays[i], arrays[j])


def tied_model():
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(),
                          nn.Linear(4, 2))
    model[2].weight.data = model[0].weight.data  # two Parameters, one storage
    return model


def test_claim_free_buffer_keeps_tied_parameters_out_of_the_flat_array():
    model = tied_model()
    params = list(model.parameters())
    before = [p.numpy().copy() for p in params]
    buf = ParamAndGradBuffer(params, [n for n, _ in model.named_parameters()], MPI.COMM_SELF,
                             who="a test", flat_params=True, claim=False)
    flat = buf.param_flats[np.dtype(np.float64)]
    tied = {0, 2}
    assert np.shares_memory(params[0].array, params[2].array)
    for i, p in enumerate(params):
        assert np.shares_memory(p.array, flat) == (i not in tied)
        np.testing.assert_array_equal(p.numpy(), before[i])
    layout = buf.layouts[np.dtype(np.float64)]
    for i, (off, n, _) in enumerate(layout.slices()):  # the tied ones' places stay zero
        np.testing.assert_array_equal(flat[off:off + n], 0.0 if i in tied else before[i].ravel())
    model[0].weight.data.add_(1.0)  # still one storage
    np.testing.assert_array_equal(params[2].numpy(), before[0] + 1.0)
    buf.close()


def test_claiming_buffer_refuses_tied_parameters_naming_both_and_changes_nothing():
    model = tied_model()
    params = list(model.parameters())
    arrays = [p.array for p in params]
    names = [n for n, _ in model.named_parameters()]
    with pytest.raises(ValueError, match=r"a test: 0\.weight and 2\.weight share storage"):
        ParamAndGradBuffer(params, names, MPI.COMM_SELF, who="a test", flat_params=True)
    assert all(p.array is a for p, a in zip(params, arrays))
    model[0].weight.data = sn.zeros(4, 4)  # not claimed


@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1)], ids=["sgd-momentum", "adamw"])
def test_ddp_keeps_the_tie_and_trains_bit_for_bit_like_flat_params_false(make):
    model, ref_model = tied_model(), tied_model()
    ddp = parallel.DistributedDataParallel(model)  # flat_params=True by default
    ref = parallel.DistributedDataParallel(ref_model, flat_params=False)
    flat = ddp.buffer.param_flats[np.dtype(np.float64)]
    params, ref_params = list(model.parameters()), list(ref_model.parameters())
    assert np.shares_memory(params[0].array, params[2].array)
    assert [np.shares_memory(p.array, flat) for p in params] == [False, True, False, True,
                                                                 True, True]
    opt, ref_opt = make(params), make(ref_params)
    rng = np.random.default_rng(dist.rank())
    for _ in range(3):
        x = sn.tensor(rng.standard_normal((3, 4)))
        for net, o in ((ddp, opt), (ref, ref_opt)):
            o.zero_grad()
            net(x).pow(2).sum().backward()
            o.step()
        for p, r in zip(params, ref_params):
            np.testing.assert_array_equal(p.grad.array, r.grad.array, strict=True)
            np.testing.assert_array_equal(p.array, r.array, strict=True)
        assert np.shares_memory(params[0].array, params[2].array)
        np.testing.assert_array_equal(params[0].array, params[2].array)
    # every rank holds the same parameters
    for got in dist.world().comm.allgather([p.numpy() for p in params]):
        for a, b in zip(got, params):
            np.testing.assert_array_equal(a, b.numpy())
    ddp.close()
    ref.close()


def test_zero_refuses_tied_storage_naming_both_parameters():
    model = tied_model()
    with pytest.raises(ValueError, match=r"ZeroRedundancyOptimizer: parameter 0 \(shape "
                       r"\(4, 4\)\) and parameter 2 \(shape \(4, 4\)\) share storage"):
        parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.SGD,
                                         lr=0.1)
