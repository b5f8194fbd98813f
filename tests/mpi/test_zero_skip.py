"""A skipped non-finite step leaves every parameter and all optimizer state
exactly as they were, under every ZeRO mode and optimizer (issue 26, items 3
and 4): the oracle is the state before the step, compared bit for bit."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel

pytestmark = pytest.mark.mpi

OPTIMIZERS = {
    "sgd-momentum": (optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    "adam": (optim.Adam, {"lr": 0.01}),
    "adamw": (optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
}
# (stage, over DataParallel, reduce_gradients): every way ZeRO gets its gradients
MODES = {"zero1-over-ddp": (1, True, False), "zero1-reduce": (1, False, True),
         "zero2": (2, False, False)}


def build(mode, opt_name, nonfinite):
    stage, over_ddp, reduce = MODES[mode]
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    net = parallel.DataParallel(model, nonfinite=nonfinite) if over_ddp else model
    cls, options = OPTIMIZERS[opt_name]
    zero_nonfinite = "ignore" if over_ddp else nonfinite
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), cls, stage=stage,
                                          reduce_gradients=reduce, nonfinite=zero_nonfinite,
                                          bucket_mb=0.0001, **options)
    return net, model, zo


def train_step(net, zo, broken=False):
    x = np.full((2, 3), 0.5 + dist.rank(), np.float32)
    if broken and dist.rank() == dist.size() - 1:
        x[0, 0] = np.nan  # the last rank's data is broken
    zo.zero_grad()
    F.cross_entropy(net(sn.tensor(x)), np.array([0, 1])).backward()
    zo.step()


def snapshot(model, zo):
    state = zo.state_dict()
    flat = {(i, k): np.array(v, copy=True) for i, entries in state["state"].items()
            for k, v in entries.items()}
    return [p.array.copy() for p in model.parameters()], flat


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mode", sorted(MODES))
def test_skipped_step_changes_nothing(mode, opt_name):
    net, model, zo = build(mode, opt_name, "skip")
    train_step(net, zo)  # a healthy step first: momentum and moments are non-zero
    params, state = snapshot(model, zo)
    assert any(np.abs(v).max() > 0 for v in state.values() if v.ndim)
    train_step(net, zo, broken=True)
    after_params, after_state = snapshot(model, zo)
    for before, after in zip(params, after_params):
        np.testing.assert_array_equal(after, before)
    assert after_state.keys() == state.keys()
    for key, value in state.items():
        np.testing.assert_array_equal(after_state[key], value, err_msg=str(key))
    train_step(net, zo)  # the next healthy step trains again
    assert any(not np.array_equal(p.array, b) for p, b in zip(model.parameters(), params))
    zo.close()
    if hasattr(net, "close"):
        net.close()


@pytest.mark.parametrize("mode", ["zero1-reduce", "zero2"])
def test_zero_raise_names_rank_and_step(mode):
    net, model, zo = build(mode, "adamw", "raise")
    train_step(net, zo)
    with pytest.raises(sn.errors.NonFiniteError) as info:
        train_step(net, zo, broken=True)
    msg = str(info.value)
    assert f"rank {dist.size() - 1} parameter '#0 (shape (5, 3))'" in msg and "step 1" in msg
    zo.close()


def test_zero2_default_is_dataparallels():
    _, model, zo = build("zero2", "adam", None)
    assert zo.nonfinite == parallel.DataParallel(nn.Linear(2, 2)).nonfinite == "ignore"
    with pytest.raises(ValueError, match="nonfinite must be"):
        parallel.ZeroRedundancyOptimizer(model.parameters(), optim.Adam, nonfinite="warn")
    zo.close()


def test_allreduce_gradients_skip_and_raise():
    sn.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = optim.AdamW(model.parameters(), lr=0.1)
    before = [p.array.copy() for p in model.parameters()]
    x = np.ones((2, 3), np.float32)
    if dist.rank() == dist.size() - 1:
        x[0, 0] = np.inf
    F.cross_entropy(model(sn.tensor(x)), np.array([0, 1])).backward()
    assert parallel.allreduce_gradients(model.parameters(), nonfinite="skip") is True
    opt.step()
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.array, b)
    assert not opt.state
    F.cross_entropy(model(sn.tensor(x)), np.array([0, 1])).backward()
    with pytest.raises(sn.errors.NonFiniteError, match=f"rank {dist.size() - 1} parameter"):
        parallel.allreduce_gradients(model.parameters(), nonfinite="raise")


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_skipped_step_of_the_other_wrappers_changes_nothing(wrapper):
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    net = (parallel.DataParallel(model, nonfinite="skip") if wrapper == "ddp" else
           parallel.FullyShardedDataParallel(model, wrap={nn.Linear}, nonfinite="skip"))
    opt = optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1)

    def step(broken=False):
        x = np.full((2, 3), 0.5 + dist.rank(), np.float32)
        if broken and dist.rank() == dist.size() - 1:
            x[0, 0] = np.nan
        opt.zero_grad()
        F.cross_entropy(net(sn.tensor(x)), np.array([0, 1])).backward()
        opt.step()

    step()
    params = [p.array.copy() for p in net.parameters()]
    state = {(id(p), k): np.array(v, copy=True) for p, s in opt.state.items()
             for k, v in s.items() if hasattr(v, "shape")}
    step(broken=True)
    for p, b in zip(net.parameters(), params):
        np.testing.assert_array_equal(p.array, b)
    for (pid, k), v in state.items():
        p = next(q for q in opt.state if id(q) == pid)
        np.testing.assert_array_equal(opt.state[p][k], v)
    assert net.skipped_steps == 1
    net.close()
