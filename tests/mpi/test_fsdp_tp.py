"""FSDP over ``mesh.dp`` with tensor parallelism inside (2-D: FSDP x TP).

A Megatron MLP (column then row) is an FSDP unit, a plain Linear the root
unit. Training on each data-parallel replica's part of the batch must equal
the serial (dense) model trained on the whole batch; ``fsdp.state_dict()`` is
gathered over the FSDP group only, so TP layers' entries stay this TP rank's
slices of the dense parameters (float64, several steps, SGD and Adam).
"""
import numpy as np
import pytest

import spmdnet as sn
from spmdnet import dist, nn, parallel
from tests.helpers.oracles import OPTIMIZERS, train_step

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
IN, HID, OUT, LOCAL = 5, 12, 7, 3  # HID divisible by tp; 5*5+5 and 12*5+12 odd sizes
TOL = {"rtol": 1e-10, "atol": 1e-12}


class TPBlock(nn.Sequential):
    """The wrap unit: a column-parallel then row-parallel Linear."""


def tp_model(comm):
    sn.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, IN), nn.Tanh(), TPBlock(
        parallel.ColumnParallelLinear(IN, HID, comm), nn.Tanh(),
        parallel.RowParallelLinear(HID, OUT, comm, input_is_parallel=True)))


def dense_model():
    sn.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, IN), nn.Tanh(), nn.Sequential(
        nn.Linear(IN, HID), nn.Tanh(), nn.Linear(HID, OUT)))


def tp_slice(full, axis, mesh):
    return full if axis is None else np.split(full, mesh.tp_size, axis=axis)[mesh.tp_rank]


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("tp", [1, 2])
def test_fsdp_over_dp_with_tp_inside_equals_serial(tp, opt_name):
    if dist.size() % tp:
        pytest.skip(f"tp={tp} does not divide {dist.size()} ranks")
    with dist.Mesh(tp=tp) as mesh:
        train_against_serial(mesh, opt_name)


def train_against_serial(mesh, opt_name):
    model = tp_model(mesh.tp)
    axes = {k: getattr(p, "tp_split_axis", None) for k, p in model.named_parameters()}
    fsdp = parallel.FullyShardedDataParallel(model, comm=mesh.dp, wrap={TPBlock})
    assert len(fsdp.units) == 2
    serial = dense_model()
    opt, serial_opt = OPTIMIZERS[opt_name](fsdp.parameters()), OPTIMIZERS[opt_name](
        serial.parameters())
    mine = slice(mesh.dp_rank * LOCAL, (mesh.dp_rank + 1) * LOCAL)
    n = LOCAL * mesh.dp_size
    for step in range(4):
        rng = np.random.default_rng(10 + step)
        x, y = rng.standard_normal((n, IN)), rng.integers(0, OUT, n)
        train_step(fsdp, opt, x[mine], y[mine])
        train_step(serial, serial_opt, x, y)
        state, want = fsdp.state_dict(), serial.state_dict()
        assert list(state) == list(want)
        for key in want:  # gathered over FSDP only: TP entries are this TP rank's slices
            np.testing.assert_allclose(state[key], tp_slice(want[key], axes[key], mesh), **TOL,
                                       err_msg=f"step {step} {key}")
    full_opt = fsdp.optim_state_dict(opt)["state"]
    for key, entries in full_opt.items():
        for name, value in entries.items():
            if np.ndim(value):
                assert np.shape(value) == state[key].shape, (key, name)
    assert all(p.array.size == 0 for p in model.parameters())
    fsdp.close()
