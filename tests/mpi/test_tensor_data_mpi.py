"""``p.data = t`` on a parameter whose storage a wrapper owns (FSDP's and
ZeRO's flat buffers) raises, naming the wrapper and the parameter, instead
of silently detaching it; in-place writes through ``.data`` still work, and
the parameters are the user's again after ``close()``. Any number of ranks."""
import numpy as np
import pytest

import spmdnet as sn
from spmdnet import dist, nn, optim, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]


def make_model():
    sn.manual_seed(2)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))


def test_fsdp_refuses_rebinding_a_parameter_it_shards():
    model = make_model()
    fsdp = parallel.FullyShardedDataParallel(model)
    p = model[2].weight
    with pytest.raises(RuntimeError, match=r"\.data of parameter '2\.weight' of "
                                           r"FullyShardedDataParallel"):
        p.data = sn.zeros(2, 5)
    with pytest.raises(RuntimeError, match="FullyShardedDataParallel"):
        model.to(np.float32)  # Module.to rebinds through .data: refused the same way
    before = fsdp.state_dict()
    fsdp.close()
    assert model[2].weight.dtype == np.float64
    np.testing.assert_array_equal(model[2].weight.numpy(), before["2.weight"])
    p.data = sn.zeros(2, 5)  # closed: the parameter is the user's again
    assert p.shape == (2, 5) and not p.numpy().any()


def test_zero_refuses_rebinding_a_parameter_in_its_flat_buffer():
    model = make_model()
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.SGD,
                                          lr=0.1)
    w = model[0].weight
    with pytest.raises(RuntimeError, match=r"parameter 0 \(shape \(5, 3\)\) of "
                                           "ZeroRedundancyOptimizer"):
        w.data = sn.zeros(5, 3)
    with pytest.raises(RuntimeError, match="ZeroRedundancyOptimizer"):
        zo.shard_param.data = sn.zeros(zo.shard_param.shape)
    assert np.shares_memory(w.array, zo.flat)
    w.data.fill_(0.25)  # in place through .data: the flat buffer sees it
    w.data *= 2.0       # augmented assignment writes in place, nothing to rebind
    np.testing.assert_array_equal(zo.flat[:15], np.full(15, 0.5))
    zo.close()
    w.data = sn.zeros(5, 3)
    assert not np.shares_memory(w.array, zo.flat)


def test_data_parallel_leaves_parameters_rebindable_and_brings_grad_data_home():
    # DataParallel owns the gradients' storage, not the parameters': a
    # rebound .grad.data is copied into the bucket at the next backward
    # (tests/mpi/test_grad_tensor_mpi.py); the parameters are the user's.
    model = make_model()
    ddp = parallel.DataParallel(model)
    w = model[0].weight
    replacement = np.full((5, 3), float(dist.size()))
    w.data = replacement
    assert w.array is replacement
    ddp.close()
