"""pp x tp x dp together: a pipeline of tensor-parallel stages, data
parallel over dp, equals the serial model (loss and every gradient); so does
examples/train_3d.py's model, on every layout the world size allows (loss,
updated weights and pipeline inference)."""

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel
from tests.helpers.launch import load_example

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
IN, HIDDEN, CLASSES, BATCH = 6, 8, 3, 16


def serial_model():
    sn.manual_seed(4)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, CLASSES))


def stage(mesh):
    """Stage 0: a column-then-row TP block; stage 1: the output layer. Built
    from the same seed as the serial model, in the same draw order."""
    sn.manual_seed(4)
    first = [parallel.ColumnParallelLinear(IN, HIDDEN, mesh.tp), nn.Tanh(),
             parallel.RowParallelLinear(HIDDEN, HIDDEN, mesh.tp), nn.Tanh()]
    last = [nn.Linear(HIDDEN, CLASSES)]
    return nn.Sequential(*(first if mesh.pp_rank == 0 else last)), (0 if mesh.pp_rank == 0 else 4)


def shard(grad, p, mesh):
    axis = getattr(p, "tp_split_axis", None)
    if axis is None:
        return grad
    k = grad.shape[axis] // mesh.tp_size
    return np.take(grad, range(mesh.tp_rank * k, (mesh.tp_rank + 1) * k), axis=axis)


def test_pipeline_of_tensor_parallel_stages_with_data_parallel_equals_serial():
    if dist.size() % 4:
        pytest.skip("needs tp=2 x pp=2 (x dp): a world size divisible by 4")
    mesh = dist.Mesh(tp=2, pp=2)
    module, offset = stage(mesh)
    ddp = parallel.DataParallel(module, comm=mesh.dp)
    pipe = parallel.Pipeline(ddp, mesh.pp, micro_batches=2)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((BATCH * mesh.dp_size, IN)), rng.integers(0, 3, BATCH * mesh.dp_size)
    mine = slice(mesh.dp_rank * BATCH, (mesh.dp_rank + 1) * BATCH)
    loss = pipe.train_step(x[mine], y[mine], F.cross_entropy)
    serial = serial_model()
    F.cross_entropy(serial(sn.tensor(x)), y).backward()
    local = F.cross_entropy(serial_model()(sn.tensor(x[mine])), y[mine]).item()
    assert abs(loss - local) < 1e-12
    serial_params = dict(serial.named_parameters())
    for name, p in module.named_parameters():
        index, attr = name.split(".")
        q = serial_params[f"{int(index) + offset}.{attr}"]
        np.testing.assert_allclose(p.grad.array, shard(q.grad.array, p, mesh), rtol=1e-10,
                                   atol=1e-13, err_msg=name)
    ddp.close()
    mesh.free()


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_train_3d_example_model_equals_serial(tp, pp):
    if dist.size() % (tp * pp):
        pytest.skip(f"tp={tp} x pp={pp} needs a world size divisible by {tp * pp}")
    train_3d = load_example("train_3d")
    mesh = dist.Mesh(tp=tp, pp=pp)
    args = train_3d.parse_args(["--hidden", str(HIDDEN), "--micro-batches", "2"])
    sn.manual_seed(4)
    net = train_3d.Net(args, mesh, IN, CLASSES)
    sn.manual_seed(4)  # the serial model: the same layers, drawn in the same order
    serial = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Dropout(0.0),
                           nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Dropout(0.0),
                           nn.Linear(HIDDEN, CLASSES))
    rng = np.random.default_rng(2)
    n = BATCH * mesh.dp_size
    x, y = rng.standard_normal((n, IN)), rng.integers(0, CLASSES, n)
    mine = slice(mesh.dp_rank * BATCH, (mesh.dp_rank + 1) * BATCH)
    with sn.no_grad():
        local = F.cross_entropy(serial(sn.tensor(x[mine])), y[mine]).item()

    loss = net.train_step(x[mine], y[mine], optim.SGD(net.module.parameters(), lr=0.1))
    serial_opt = optim.SGD(serial.parameters(), lr=0.1)
    F.cross_entropy(serial(sn.tensor(x)), y).backward()  # data parallel = the whole batch
    serial_opt.step()
    assert abs(loss - local) < 1e-12
    offset = 0 if mesh.pp_rank == 0 else 6  # stage 1 holds the output layer, serial's 6
    serial_params = dict(serial.named_parameters())
    for name, p in net.module.named_parameters():
        index, attr = name.split(".")
        q = serial_params[f"{int(index) + offset}.{attr}"]
        np.testing.assert_allclose(p.array, shard(q.array, p, mesh), rtol=1e-10, atol=1e-13,
                                   err_msg=name)
    net.eval()
    test = rng.standard_normal((5, IN))
    np.testing.assert_allclose(np.asarray(net(sn.tensor(test)).array),
                               serial(sn.tensor(test)).numpy(), rtol=1e-10, atol=1e-13)
    net.ddp.close()
    mesh.free()
