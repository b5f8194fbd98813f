"""Module hooks on the children of a model wrapped in DistributedDataParallel
fire as on the serial model: forward and backward hooks in PyTorch's order,
each rank's backward hooks see that rank's own gradients (checked against
the serial model on the same local batch), and the parameters' gradients
are still the average over the ranks."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import dist, nn

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]


def make_model():
    sn.manual_seed(5)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 6), nn.GELU(),
                         nn.Dropout(0.0), nn.Linear(6, 3))


def watch(model):
    log = []
    for name, m in model.named_children():
        m.register_forward_pre_hook(lambda mod, a, n=name: log.append((f"pre {n}", None)))
        m.register_forward_hook(lambda mod, a, o, n=name: log.append((f"fwd {n}", o.numpy())))
        m.register_full_backward_pre_hook(
            lambda mod, go, n=name: log.append((f"bpre {n}", go[0].numpy().copy())))
        m.register_full_backward_hook(
            lambda mod, gi, go, n=name: log.append((f"bwd {n}", gi[0].numpy().copy())))
    return log


def batch(rank):
    rng = np.random.default_rng(10 + rank)
    return rng.standard_normal((3, 4)), rng.integers(0, 3, 3)


def test_hooks_on_the_children_of_a_ddp_model_fire_as_on_the_serial_model():
    model, serial = make_model(), make_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    log, want = watch(model), watch(serial)
    x, y = batch(dist.rank())
    F.cross_entropy(ddp(sn.tensor(x, requires_grad=True)), y).backward()
    F.cross_entropy(serial(sn.tensor(x, requires_grad=True)), y).backward()
    names = [e for e, _ in log]
    assert names == [e for e, _ in want]
    assert names[:12] == [f"{k} {i}" for i in range(6) for k in ("pre", "fwd")]
    assert names[12:] == [f"{k} {i}" for i in range(5, -1, -1) for k in ("bpre", "bwd")]
    for (event, got), (_, ref) in zip(log, want):
        if ref is not None:  # this rank's own activations and gradients
            np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14, err_msg=event)
    # DDP still averages: the mean of every rank's serial gradient
    mean = {}
    for r in range(dist.size()):
        ref = make_model()
        xr, yr = batch(r)
        F.cross_entropy(ref(sn.tensor(xr)), yr).backward()
        for name, q in ref.named_parameters():
            mean[name] = mean.get(name, 0) + q.grad.numpy() / dist.size()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), mean[name], rtol=1e-12, atol=1e-14,
                                   err_msg=name)
    ddp.close()
