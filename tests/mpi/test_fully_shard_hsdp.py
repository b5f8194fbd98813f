"""``fully_shard`` on a 2-D (replicate, shard) DeviceMesh (HSDP) and with
``CPUOffloadPolicy``, against serial training on the global batch (float64,
1 to 4 ranks; the widths do not divide by 2, 3 or 4)."""
import numpy as np
import pytest

import spmdnet as torch
import spmdnet.distributed as dist
from spmdnet import nn
from spmdnet.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                       set_model_state_dict)
from spmdnet.distributed.device_mesh import init_device_mesh
from spmdnet.distributed.fsdp import CPUOffloadPolicy, fully_shard
from spmdnet.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from spmdnet.distributed.tensor import _api as dtensor_api

from . import fully_shard_cases as C

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
IN, D, H, OUT, B = 4, 5, 7, 3, 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(IN, D)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(D), nn.Linear(D, H), nn.Tanh(),
                                                   nn.Linear(H, D)) for _ in range(2)])
        self.head = nn.Linear(D, OUT)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def _models(seed=0, **kwargs):
    return C.models(Net, seed, **kwargs)


def _batch(step):
    return C.batch(step, IN, OUT, B)


def _train(model, serial, steps=3):
    C.train(model, serial, steps, _batch)


_loss, _assert_same = C.loss, C.assert_same_params


def _hsdp_mesh(replicate):
    size = dist.get_world_size()
    if size % replicate:
        pytest.skip(f"a ({replicate}, {size}/{replicate}) mesh needs the world size "
                    f"{size} divisible by {replicate}")
    return init_device_mesh("cpu", (replicate, size // replicate),
                            mesh_dim_names=("dp_replicate", "dp_shard"))


@pytest.mark.parametrize("replicate", [1, 2, 3, 4])
def test_hsdp_shards_over_the_inner_dim_and_matches_serial(replicate):
    mesh = _hsdp_mesh(replicate)
    model, serial = _models(mesh=mesh)
    shards = mesh.size(1)
    inner = mesh.get_local_rank("dp_shard")
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor) and p.placements == (Replicate(), Shard(0)), name
        rows, step = p.global_shape[0], -(-p.global_shape[0] // shards)
        assert p.to_local().shape[0] == max(0, min(step, rows - inner * step)), name
    _train(model, serial)
    _assert_same(model, serial)
    gx, gy, x, y = _batch(7)
    _loss(model, x, y).backward()
    _loss(serial, gx, gy).backward()
    total = nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    expected = nn.utils.clip_grad_norm_(serial.parameters(), 0.01)
    assert abs(float(total) - float(expected)) <= 1e-12 * float(expected)
    # the replicas hold equal shards: gather every rank's and compare within replicas
    for name, p in model.named_parameters():
        mine, others = p.to_local().array, [None] * dist.get_world_size()
        dist.all_gather_object(others, (inner, mine))
        for s, arr in others:
            if s == inner:
                np.testing.assert_array_equal(arr, mine, err_msg=name)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    for key, value in serial.state_dict().items():
        np.testing.assert_allclose(full[key].array, value.array, rtol=0, atol=1e-12)
    other, _ = _models(seed=5, mesh=mesh)
    set_model_state_dict(other, full, options=StateDictOptions(full_state_dict=True))
    _assert_same(other, serial)
    x = _batch(0)[2]
    np.testing.assert_allclose(model(x).array, other(x).array, rtol=0, atol=0)


def test_dtensor_on_a_2d_mesh():
    mesh = _hsdp_mesh(2 if dist.get_world_size() % 2 == 0 else 1)
    expected = np.arange(11 * 3, dtype=np.float64).reshape(11, 3)
    t = distribute_tensor(torch.tensor(expected + 100 * dist.get_rank()), mesh,
                          [Replicate(), Shard(0)])  # rank 0's tensor everywhere
    np.testing.assert_array_equal(t.full_tensor().array, expected)
    inner = mesh.get_local_rank(1)
    joined = DTensor.from_local(t.to_local(), mesh, [Replicate(), Shard(0)])
    assert joined.global_shape == (11, 3)
    np.testing.assert_array_equal(joined.full_tensor().array, expected)
    step = -(-11 // mesh.size(1))
    np.testing.assert_array_equal(t.to_local().array, expected[inner * step:(inner + 1) * step])
    assert mesh["dp_shard"].size() == mesh.size(1) and mesh["dp_shard"].get_local_rank() == inner
    both = mesh["dp_replicate", "dp_shard"]
    assert both.shape == mesh.shape and both.get_coordinate() == mesh.get_coordinate()
    with pytest.raises(KeyError, match="in the mesh's order"):
        mesh["dp_shard", "dp_replicate"]
    with pytest.raises(ValueError, match="one placement per dimension"):
        distribute_tensor(torch.tensor(expected), mesh, [Shard(0)])
    with pytest.raises(NotImplementedError, match="one mesh dimension"):
        distribute_tensor(torch.tensor(expected), mesh, [Shard(0), Shard(1)])


@pytest.mark.parametrize("pin_memory", [True, False])
def test_cpu_offload_keeps_host_shards_and_matches_serial(pin_memory):
    model, serial = _models(offload_policy=CPUOffloadPolicy(pin_memory=pin_memory))
    for p in model.parameters():
        assert type(p.to_local().array) is np.ndarray
    _train(model, serial)
    for p in model.parameters():
        assert type(p.grad.array) is np.ndarray and p.grad.array.shape == p.array.shape
    _assert_same(model, serial)
    torch.manual_seed(0)
    plain = Net()
    fully_shard(plain, offload_policy=CPUOffloadPolicy(pin_memory=pin_memory),
                reshard_after_forward=True)
    gx, gy, x, y = _batch(0)
    _loss(plain, x, y).backward()
    torch.manual_seed(0)
    ref = Net()
    _loss(ref, gx, gy).backward()
    named = dict(ref.named_parameters())
    for name, p in plain.named_parameters():
        np.testing.assert_allclose(dtensor_api.gather_like(p, p.grad.array), named[name].grad.array,
                                   rtol=0, atol=1e-12, err_msg=name)
