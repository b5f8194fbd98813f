"""Tensor parallelism against the serial oracle: a column-then-row MLP on a
TP group equals the dense MLP built from the same seed (outputs, input and
weight gradients); each differentiable collective's backward equals its
definition computed locally from every rank's values; TP x DP training
equals serial large-batch training; state dicts round-trip; bad sizes raise
on every rank; dropout masks differ across TP ranks only inside a region."""
import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, parallel
from tests.helpers.oracles import OPTIMIZERS, train_step

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
IN, HID, OUT, BATCH = 5, 12, 7, 4  # HID divisible by tp = 1, 2, 3, 4
TPS = [1, 2, 3, 4]
# the oracle's own record of how Megatron splits each parameter (None: replicated)
SPLIT = {"0.weight": 0, "0.bias": 0, "2.weight": 1, "2.bias": None}
TOL = {"rtol": 1e-10, "atol": 1e-12}


@pytest.fixture(params=TPS, ids=lambda tp: f"tp{tp}")
def mesh(request):
    tp = request.param
    if dist.size() % tp:
        pytest.skip(f"tp={tp} does not divide {dist.size()} ranks")
    with dist.Mesh(tp=tp) as m:
        yield m


def dense_mlp(seed):
    sn.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HID), nn.Tanh(), nn.Linear(HID, OUT))


def tp_mlp(seed, comm, gather=False):
    """Column then row; ``gather`` routes a replicated activation between them."""
    sn.manual_seed(seed)
    return nn.Sequential(
        parallel.ColumnParallelLinear(IN, HID, comm, gather_output=gather), nn.Tanh(),
        parallel.RowParallelLinear(HID, OUT, comm, input_is_parallel=not gather))


def shard(full, key, mesh):
    axis = SPLIT[key]
    return full if axis is None else np.split(full, mesh.tp_size, axis=axis)[mesh.tp_rank]


def values(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape)


def test_shards_are_slices_of_the_dense_init(mesh):
    dense, model = dense_mlp(0).state_dict(), tp_mlp(0, mesh.tp)
    for key, p in model.named_parameters():
        np.testing.assert_array_equal(p.array, shard(dense[key], key, mesh), err_msg=key)
        assert getattr(p, "tp_split_axis", None) == SPLIT[key], key


@pytest.mark.parametrize("gather", [False, True], ids=["split", "gathered"])
def test_mlp_equals_dense(mesh, gather):
    dense, model = dense_mlp(0), tp_mlp(0, mesh.tp, gather)
    x_val, w_out = values(1, (BATCH, IN)), values(2, (BATCH, OUT))
    outs, grads = [], []
    for net in (dense, model):
        x = sn.tensor(x_val, requires_grad=True)
        out = net(x)
        (out * sn.tensor(w_out)).sum().backward()
        outs.append(out.array)
        grads.append(x.grad.array)
    np.testing.assert_allclose(outs[1], outs[0], **TOL)
    np.testing.assert_allclose(grads[1], grads[0], **TOL)
    want = dict(dense.named_parameters())
    for key, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.array, shard(want[key].grad.array, key, mesh), **TOL,
                                   err_msg=key)


# -- each differentiable collective against its definition ------------------------
def run(fn, x_val, g_val, comm):
    x = sn.tensor(x_val, requires_grad=True)
    y = fn(x, comm)
    y.backward(g_val)
    return y.array, x.grad.array


def test_copy_to_group(mesh):
    t, n = mesh.tp_rank, mesh.tp_size
    y, dx = run(parallel.copy_to_group, values(t, (2, 3)), values(50 + t, (2, 3)), mesh.tp)
    np.testing.assert_array_equal(y, values(t, (2, 3)))  # identity forward
    np.testing.assert_allclose(dx, sum(values(50 + r, (2, 3)) for r in range(n)), **TOL)


def test_reduce_from_group(mesh):
    t, n = mesh.tp_rank, mesh.tp_size
    y, dx = run(parallel.reduce_from_group, values(t, (2, 3)), values(50 + t, (2, 3)), mesh.tp)
    np.testing.assert_allclose(y, sum(values(r, (2, 3)) for r in range(n)), **TOL)
    np.testing.assert_array_equal(dx, values(50 + t, (2, 3)))  # identity backward


def test_gather_from_group(mesh):
    t, n = mesh.tp_rank, mesh.tp_size
    g = values(50 + t, (2, 3 * n))
    y, dx = run(parallel.gather_from_group, values(t, (2, 3)), g, mesh.tp)
    np.testing.assert_array_equal(y, np.concatenate([values(r, (2, 3)) for r in range(n)], -1))
    np.testing.assert_array_equal(dx, g[:, 3 * t:3 * t + 3])


def test_scatter_to_group(mesh):
    t, n = mesh.tp_rank, mesh.tp_size
    x = values(t, (2, 3 * n))
    y, dx = run(parallel.scatter_to_group, x, values(50 + t, (2, 3)), mesh.tp)
    np.testing.assert_array_equal(y, x[:, 3 * t:3 * t + 3])
    np.testing.assert_array_equal(dx, np.concatenate([values(50 + r, (2, 3))
                                                      for r in range(n)], -1))


def test_scatter_of_an_uneven_axis_raises():
    if dist.size() == 1:
        pytest.skip("every width divides one rank")
    with pytest.raises(ValueError, match=f"length {dist.size() + 1} is not divisible"):
        parallel.scatter_to_group(sn.tensor(np.ones((2, dist.size() + 1))), MPI.COMM_WORLD)


# -- TP x DP training ---------------------------------------------------------------
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_tp_dp_training_equals_serial_large_batch(mesh, opt_name):
    local = 3
    serial = dense_mlp(0)
    serial_opt = OPTIMIZERS[opt_name](serial.parameters())
    model = tp_mlp(mesh.dp_rank, mesh.tp)  # replicas differ: the wrap broadcasts over dp
    ddp = parallel.DataParallel(model, comm=mesh.dp)
    opt = OPTIMIZERS[opt_name](ddp.parameters())
    mine = slice(mesh.dp_rank * local, (mesh.dp_rank + 1) * local)
    for step in range(5):
        x, y = values(10 + step, (local * mesh.dp_size, IN)), np.arange(local * mesh.dp_size) % OUT
        train_step(ddp, opt, x[mine], y[mine])
        train_step(serial, serial_opt, x, y)
        want = serial.state_dict()
        for key, p in model.named_parameters():
            np.testing.assert_allclose(p.array, shard(want[key], key, mesh), **TOL,
                                       err_msg=f"step {step} {key}")
    ddp.close()


# -- state dicts ------------------------------------------------------------------
def test_gather_then_scatter_round_trip(mesh):
    model = tp_mlp(0, mesh.tp)
    state = parallel.gather_state_dict(model, mesh)
    if dist.rank() == 0:
        dense = dense_mlp(0).state_dict()
        assert list(state) == list(dense)
        for key in dense:
            np.testing.assert_array_equal(state[key], dense[key], err_msg=key)
        serial = dense_mlp(9)
        serial.load_state_dict(state)  # a TP model's weights load into a serial one
        x = sn.tensor(values(3, (BATCH, IN)))
        np.testing.assert_allclose(serial(x).array, model(x).array, **TOL)
    else:
        assert state is None
        model(sn.tensor(values(3, (BATCH, IN))))  # the forward's collectives
    other = dense_mlp(1).state_dict()
    parallel.scatter_state_dict(model, other if dist.rank() == 0 else None, mesh)
    for key, p in model.named_parameters():
        np.testing.assert_array_equal(p.array, shard(other[key], key, mesh), err_msg=key)
    again = parallel.gather_state_dict(model, mesh)
    if dist.rank() == 0:
        for key in other:
            np.testing.assert_array_equal(again[key], other[key], err_msg=key)


def test_scatter_of_a_wrong_state_raises_on_every_rank(mesh):
    model = tp_mlp(0, mesh.tp)
    bad = dense_mlp(0).state_dict()
    bad["2.weight"] = np.zeros((OUT, HID + 1))
    with pytest.raises(ValueError, match=r"2\.weight: state \(7, 13\) vs full model \(7, 12\)"):
        parallel.scatter_state_dict(model, bad if dist.rank() == 0 else None, mesh)
    assert MPI.COMM_WORLD.allreduce(1) == dist.size()


@pytest.mark.parametrize("layer,what", [(parallel.ColumnParallelLinear, "out_features"),
                                        (parallel.RowParallelLinear, "in_features")])
def test_width_not_divisible_raises_on_every_rank(layer, what):
    size = dist.size()
    if size == 1:
        pytest.skip("every width divides one rank")
    width = size + 1
    args = (IN, width) if what == "out_features" else (width, OUT)
    with pytest.raises(ValueError) as info:
        layer(*args, MPI.COMM_WORLD)
    msg = str(info.value)
    assert layer.__name__ in msg and f"{what} {width}" in msg and f"size {size}" in msg
    assert MPI.COMM_WORLD.allreduce(1) == size


def test_passing_the_mesh_instead_of_its_group_raises(mesh):
    with pytest.raises(TypeError, match=r"e\.g\. mesh\.tp"):
        parallel.ColumnParallelLinear(IN, HID, mesh)


# -- dropout streams ----------------------------------------------------------------
def masks(comm, inside):
    ones = sn.tensor(np.ones((4, 64)))
    if not inside:
        return comm.allgather(F.dropout(ones, 0.5).array)
    with parallel.tp_rng_region(comm):
        return comm.allgather(F.dropout(ones, 0.5).array)


def all_different(arrays):
    return all(not np.array_equal(a, b) for i, a in enumerate(arrays) for b in arrays[i + 1:])


def test_dropout_differs_inside_a_tp_region_and_agrees_outside(mesh):
    sn.manual_seed(0)
    before = masks(MPI.COMM_WORLD, inside=False)
    inside = masks(mesh.tp, inside=True)
    after = masks(MPI.COMM_WORLD, inside=False)
    again = masks(mesh.tp, inside=True)
    assert all(np.array_equal(m, before[0]) for m in before)  # the same outside
    assert all(np.array_equal(m, after[0]) for m in after)
    assert all_different(inside) and all_different(again)  # differ across TP ranks
    assert not np.array_equal(inside[mesh.tp_rank], again[mesh.tp_rank])  # stream advances
    sn.manual_seed(0)
    masks(MPI.COMM_WORLD, inside=False)
    plain = masks(MPI.COMM_WORLD, inside=False)
    np.testing.assert_array_equal(plain[0], after[0])  # the region left the main stream alone
    np.testing.assert_array_equal(masks(mesh.tp, inside=True)[mesh.tp_rank],
                                  inside[mesh.tp_rank])  # manual_seed restarts the fork


def test_dropout_region_on_same_tp_rank_agrees_across_dp(mesh):
    sn.manual_seed(0)
    with parallel.tp_rng_region(mesh):
        mask = F.dropout(sn.tensor(np.ones((4, 64))), 0.5).array
    everyone = mesh.dp.allgather(mask)
    assert all(np.array_equal(m, mask) for m in everyone)


def test_rng_state_covers_forked_streams_and_parallel_dropout(mesh):
    sn.manual_seed(0)
    layer = parallel.ParallelDropout(0.5, mesh.tp)
    ones = sn.tensor(np.ones((4, 64)))
    layer(ones)
    state = sn.get_rng_state()
    first = layer(ones).array
    sn.set_rng_state(state)
    np.testing.assert_array_equal(layer(ones).array, first)
    sn.manual_seed(0)
    with parallel.tp_rng_region(mesh):
        F.dropout(ones, 0.5)
        np.testing.assert_array_equal(F.dropout(ones, 0.5).array, first)
    layer.eval()
    assert layer(ones) is ones


def test_a_process_group_is_a_tensor_parallel_group(mesh):
    # PyTorch programs hold process groups: a layer takes one as its TP group
    group = dist.new_group(list(range(dist.size())))
    by_group = parallel.ColumnParallelLinear(IN, HID, group)
    assert by_group.comm is group.comm and by_group.tp_size == dist.size()
    with pytest.raises(TypeError, match=r"a process group \(dist\.new_group\)"):
        parallel.ColumnParallelLinear(IN, HID, object())
    dist.destroy_process_group(group)
