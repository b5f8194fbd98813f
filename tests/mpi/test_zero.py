"""ZeRO-1 against plain data parallelism: same parameters, same state."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]


def make_model():
    sn.manual_seed(1)
    # 42 + 32 + 15 = 89 parameters: the flat buffer splits unevenly over 2, 3, 4 ranks
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 4), nn.Tanh(),
                         nn.Linear(4, 3))


def batch(step):
    rng = np.random.default_rng(step)
    x, y = rng.standard_normal((4 * dist.size(), 5)), rng.integers(0, 3, 4 * dist.size())
    r = dist.rank()
    return x[4 * r:4 * r + 4], y[4 * r:4 * r + 4]


@pytest.mark.parametrize("cls,kw", [(optim.Adam, {"lr": 0.01, "weight_decay": 0.1}),
                                    (optim.AdamW, {"lr": 0.02}),
                                    (optim.SGD, {"lr": 0.1, "momentum": 0.9})])
@pytest.mark.parametrize("reduce_gradients", [False, True])
def test_zero_equals_data_parallel(cls, kw, reduce_gradients):
    ref_model, model = make_model(), make_model()
    numel = sum(p.array.size for p in model.parameters())
    assert numel == 89 and (dist.size() == 1 or numel % dist.size())  # an uneven split
    ref = parallel.DataParallel(ref_model)
    ref_opt = cls(ref_model.parameters(), **kw)
    wrapped = model if reduce_gradients else parallel.DataParallel(model)
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls,
                                          reduce_gradients=reduce_gradients, **kw)
    for step in range(5):
        x, y = batch(step)
        for m, o in ((ref, ref_opt), (wrapped, zo)):
            o.zero_grad()
            F.cross_entropy(m(sn.tensor(x)), y).backward()
            o.step()
        for p, q in zip(model.parameters(), ref_model.parameters()):
            np.testing.assert_allclose(p.array, q.array, rtol=1e-12, atol=1e-14)
    full, expected = zo.state_dict(), ref_opt.state_dict()
    assert full["param_groups"][0]["params"] == expected["param_groups"][0]["params"]
    for i, entries in expected["state"].items():
        for key, value in entries.items():
            np.testing.assert_allclose(full["state"][i][key], value, rtol=1e-12, atol=1e-14)
    if not reduce_gradients:
        wrapped.close()
    ref.close()


def test_state_is_sharded_and_reloads():
    model = make_model()
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.Adam,
                                          reduce_gradients=True, lr=0.01)
    x, y = batch(0)
    F.cross_entropy(model(sn.tensor(x)), y).backward()
    zo.step()
    per_rank = zo.state_bytes()
    assert per_rank == 2 * 8 * -(-89 // dist.size())  # exp_avg + exp_avg_sq, one shard
    state = zo.state_dict()
    other = make_model()
    zo2 = parallel.ZeroRedundancyOptimizer(other.parameters(), optimizer_class=optim.Adam,
                                           reduce_gradients=True, lr=0.01)
    zo2.load_state_dict(state)
    for key in ("exp_avg", "exp_avg_sq"):
        np.testing.assert_array_equal(zo2.optim.state[zo2.shard_param][key],
                                      zo.optim.state[zo.shard_param][key])
