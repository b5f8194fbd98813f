"""Forward hooks and forward pre-hooks on every module of a Sequential fire in
PyTorch's order under DataParallel and FullyShardedDataParallel too, and no
wrapper assigns anything onto the user's modules (FSDP runs its units and
saves the model's state through module hooks).

PyTorch's order for ``Sequential(a, b)(x)``: pre(seq), pre(a), a, fwd(a),
pre(b), b, fwd(b), fwd(seq); a hook registered on a module sees its own
input and output (checked against the serial model in float64).
"""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]

NAMES = ["seq", "0", "1", "2", "3", "4", "5"]  # Linear, ReLU, Linear, GELU, Dropout, Linear
EXPECTED = ["pre seq", "pre 0", "fwd 0", "pre 1", "fwd 1", "pre 2", "fwd 2", "pre 3", "fwd 3",
            "pre 4", "fwd 4", "pre 5", "fwd 5", "fwd seq"]


def make_model():
    sn.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 6), nn.GELU(),
                         nn.Dropout(0.0), nn.Linear(6, 3))


def watch(model):
    """Register a pre-hook and a forward hook on every module; returns the
    log of (event, output copy) entries and the handles."""
    log, handles = [], []
    for name, m in zip(NAMES, [model, *model]):
        handles.append(m.register_forward_pre_hook(
            lambda mod, args, name=name: log.append((f"pre {name}", None))))
        handles.append(m.register_forward_hook(
            lambda mod, args, out, name=name: log.append((f"fwd {name}", out.numpy().copy()))))
    return log, handles


def batch():
    rng = np.random.default_rng(dist.rank())
    return rng.standard_normal((2, 4)), rng.integers(0, 3, 2)


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_hooks_fire_in_pytorchs_order_under_the_wrapper(wrapper):
    serial, model = make_model(), make_model()
    net = (parallel.DataParallel(model) if wrapper == "ddp" else
           parallel.FullyShardedDataParallel(model, wrap={nn.Linear}))
    log, _ = watch(model)
    want, _ = watch(serial)
    x, y = batch()
    loss = F.cross_entropy(net(sn.tensor(x)), y)
    F.cross_entropy(serial(sn.tensor(x)), y)
    assert [event for event, _ in log] == EXPECTED == [event for event, _ in want]
    for (event, got), (_, ref) in zip(log, want):
        if got is not None:  # every module's own output, as the serial model's
            np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14, err_msg=event)
    loss.backward()
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert not {"state_dict", "load_state_dict"} & set(model.__dict__)
    net.close()


def test_fsdp_training_forward_hooks_see_a_differentiable_output_and_state_is_full():
    model = make_model()
    fsdp = parallel.FullyShardedDataParallel(model, wrap={nn.Linear})
    seen = []
    model[2].register_forward_hook(lambda m, a, out: seen.append(out.requires_grad))
    opt = optim.SGD(fsdp.parameters(), lr=0.1)
    x, y = batch()
    F.cross_entropy(fsdp(sn.tensor(x)), y).backward()
    opt.step()
    assert seen == [True]  # the unit's output in the graph (its backward recomputes)
    state = model.state_dict()  # the wrapped model's own: gathered full copies
    assert state["2.weight"].shape == (6, 6) and model[2].weight.array.size == 0
    np.testing.assert_array_equal(state["2.weight"].numpy(), fsdp.state_dict()["2.weight"])
    with sn.no_grad():
        before = fsdp(sn.tensor(x)).numpy()
    changed = {k: v * 0.5 for k, v in state.items()}
    model.load_state_dict(changed)  # through the model: this rank keeps its shards
    with sn.no_grad():
        after = fsdp(sn.tensor(x)).numpy()
    assert not np.allclose(before, after)
    np.testing.assert_allclose(fsdp.state_dict()["2.weight"].numpy(),
                               changed["2.weight"].numpy(), rtol=0, atol=0)
    fsdp.close()
    assert model[2].weight.shape == (6, 6)
