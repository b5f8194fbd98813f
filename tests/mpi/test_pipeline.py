"""Pipeline (GPipe) against the serial model: loss and gradients."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]


def full_model():
    sn.manual_seed(2)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 5), nn.Tanh(), nn.Linear(5, 3))


STAGES = [(0, 2), (2, 4), (4, 7)]  # layer ranges for up to 3 stages


def stage_of(model, pp_rank, pp_size):
    bounds = {1: [(0, 7)], 2: [(0, 4), (4, 7)], 3: STAGES}[pp_size]
    lo, hi = bounds[pp_rank]
    return nn.Sequential(*[model[i] for i in range(lo, hi)])


def data(n=8):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 6)), rng.integers(0, 3, n)


def test_bubble_fraction_formula():
    assert parallel.pipeline.bubble_fraction(2, 4) == 1 / 5
    assert parallel.pipeline.bubble_fraction(1, 8) == 0


@pytest.mark.parametrize("pp", [2, 3])
def test_pipeline_equals_serial(pp):
    if dist.size() % pp:
        pytest.skip(f"pp={pp} needs a world size divisible by {pp}")
    mesh = dist.Mesh(pp=pp)
    model = full_model()
    stage = stage_of(model, mesh.pp_rank, pp)
    x, y = data()
    if mesh.dp_size > 1:  # every data-parallel replica trains its own slice
        r, k = mesh.dp_rank, len(x) // mesh.dp_size
        x_local, y_local = x[r * k:(r + 1) * k], y[r * k:(r + 1) * k]
        stage = parallel.DataParallel(stage, comm=mesh.dp)
    else:
        x_local, y_local = x, y
    pipe = parallel.Pipeline(stage, mesh.pp, micro_batches=len(x_local) // 2)
    loss = pipe.train_step(x_local, y_local, F.cross_entropy)
    serial = full_model()
    ref = F.cross_entropy(serial(sn.tensor(x)), y)
    ref.backward()
    local_ref = F.cross_entropy(full_model()(sn.tensor(x_local)), y_local).item()
    assert abs(loss - local_ref) < 1e-12
    own = {id(p) for p in stage_of(model, mesh.pp_rank, pp).parameters()}
    for p, q in zip(model.parameters(), serial.parameters()):
        if id(p) in own:
            np.testing.assert_allclose(p.grad, q.grad, rtol=1e-10, atol=1e-13)
        else:
            assert p.grad is None  # other stages' layers are not touched here
    if isinstance(stage, parallel.DataParallel):
        stage.close()
    mesh.free()


def test_uneven_micro_batches_raise():
    if dist.size() % 2:
        pytest.skip("needs an even world size")
    mesh = dist.Mesh(pp=2)
    pipe = parallel.Pipeline(stage_of(full_model(), mesh.pp_rank, 2), mesh.pp, micro_batches=3)
    with pytest.raises(ValueError, match="not divisible into 3"):
        pipe.train_step(*data(8), F.cross_entropy)
    mesh.free()
