"""Module hooks on the children of a model wrapped in FullyShardedDataParallel
(each Linear a unit) fire as on the serial model: forward and backward hooks
in PyTorch's order, each rank's hooks seeing that rank's own activations and
gradients (checked against the serial model on the same local batch)."""
import warnings

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import dist, nn, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]


def make_model():
    sn.manual_seed(5)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 6), nn.GELU(),
                         nn.Dropout(0.0), nn.Linear(6, 3))


def watch(model, backward=True):
    log = []
    for name, m in model.named_children():
        m.register_forward_pre_hook(lambda mod, a, n=name: log.append((f"pre {n}", None)))
        m.register_forward_hook(lambda mod, a, o, n=name: log.append((f"fwd {n}", o.numpy())))
        if backward:
            m.register_full_backward_pre_hook(
                lambda mod, go, n=name: log.append((f"bpre {n}", go[0].numpy().copy())))
            m.register_full_backward_hook(lambda mod, gi, go, n=name: log.append(
                (f"bwd {n}", None if gi[0] is None else gi[0].numpy().copy())))
    return log


def run(backward):
    model, serial = make_model(), make_model()
    fsdp = parallel.FullyShardedDataParallel(model, wrap={nn.Linear})
    log, want = watch(model, backward), watch(serial, backward)
    x, y = batch(dist.rank())
    F.cross_entropy(fsdp(sn.tensor(x, requires_grad=True)), y).backward()
    F.cross_entropy(serial(sn.tensor(x, requires_grad=True)), y).backward()
    fsdp.close()
    assert all("forward" not in m.__dict__ for m in model.modules())
    names = [e for e, _ in log]
    assert names == [e for e, _ in want]
    assert names[:12] == [f"{k} {i}" for i in range(6) for k in ("pre", "fwd")]
    if backward:
        assert names[12:] == [f"{k} {i}" for i in range(5, -1, -1) for k in ("bpre", "bwd")]
    for (event, got), (_, ref) in zip(log, want):
        if ref is not None:  # this rank's own activations and gradients
            assert got is not None, event
            np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14, err_msg=event)


def batch(rank):
    rng = np.random.default_rng(10 + rank)
    return rng.standard_normal((3, 4)), rng.integers(0, 3, 3)


def test_forward_hooks_on_the_children_of_an_fsdp_model_fire_as_on_the_serial_model():
    run(backward=False)


def test_backward_hooks_on_the_children_of_an_fsdp_model_see_the_serial_gradients():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "full backward hook firing without inputs"
        run(backward=True)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.act = nn.Linear(4, 4), nn.Tanh()

    def forward(self, x):
        return self.act(self.inner(x)) + x


def count(model):
    counts = {}
    for name, m in model.named_modules():
        for kind in ("pre", "fwd", "bpre", "bwd"):
            counts[(kind, name)] = 0

        def bump(kind, n=name, *_):
            counts[(kind, n)] += 1
        m.register_forward_pre_hook(lambda *a, n=name: bump("pre", n))
        m.register_forward_hook(lambda *a, n=name: bump("fwd", n))
        m.register_full_backward_pre_hook(lambda *a, n=name: bump("bpre", n))
        m.register_full_backward_hook(lambda *a, n=name: bump("bwd", n))
    return counts


def test_every_hook_fires_as_often_as_on_the_serial_model():
    """Two steps, units that are blocks with children: each module's forward
    pre-hook, forward hook, backward pre-hook and backward hook fire as many
    times as on the serial model, though the units recompute in backward
    (the children's forward hooks run again there, as in activation
    checkpointing; the unit's own do not)."""
    def make():
        sn.manual_seed(3)
        return nn.Sequential(Block(), Block(), nn.Linear(4, 3))

    model, serial = make(), make()
    fsdp = parallel.FullyShardedDataParallel(model, wrap={Block})
    got, want = count(model), count(serial)
    x, y = batch(dist.rank())
    for _ in range(2):
        F.cross_entropy(fsdp(sn.tensor(x, requires_grad=True)), y).backward()
        F.cross_entropy(serial(sn.tensor(x, requires_grad=True)), y).backward()
    fsdp.close()
    children = {k for k in want if k[1].endswith(("inner", "act")) and k[0] in ("pre", "fwd")}
    assert {k: v for k, v in got.items() if k not in children} == \
        {k: v for k, v in want.items() if k not in children}
    assert all(want[k] == 2 and got[k] == 4 for k in children), (got, want)
    assert all(v == 2 for v in want.values())
