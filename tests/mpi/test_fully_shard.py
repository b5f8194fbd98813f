"""PyTorch's FSDP2 API (``fully_shard``, DTensor, DeviceMesh and
``torch.distributed.checkpoint.state_dict``) against serial training on the
global batch, in float64. Runs at 1 to 4 ranks; the widths (4, 5, 7, 3) do
not divide by 2, 3 or 4, so shards are uneven and some ranks hold fewer rows."""
import numpy as np
import pytest

import spmdnet as torch
import spmdnet.distributed as dist
from spmdnet import nn
from spmdnet.distributed.bucket_collectives import BucketComm
from spmdnet.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                       get_optimizer_state_dict, get_state_dict,
                                                       set_model_state_dict,
                                                       set_optimizer_state_dict, set_state_dict)
from spmdnet.distributed.device_mesh import init_device_mesh
from spmdnet.distributed.fsdp import (CPUOffloadPolicy, FSDPModule, FullyShardedDataParallel,
                                      MixedPrecisionPolicy, fully_shard)
from spmdnet.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from spmdnet.distributed.tensor import _api as dtensor_api
from spmdnet.nn.parallel import DistributedDataParallel

from . import fully_shard_cases as C

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
IN, D, H, OUT, B = 4, 5, 7, 3, 2  # widths; B rows of the batch per rank


def _net():
    return C.Net(IN, D, OUT, [C.Block(D, H), C.Block(D, H)])


def _models(seed=0):
    """(a model to shard, the same model kept serial)."""
    return C.models(_net, seed, shard=False)


def _shard(model, **kwargs):
    for block in model.blocks:
        fully_shard(block, **kwargs)
    return fully_shard(model, **kwargs)


def _batch(step):
    return C.batch(step, IN, OUT, B)


def _train(model, serial, steps):
    return C.train(model, serial, steps, _batch)


_loss, _assert_same_params = C.loss, C.assert_same_params


def _assert_same_grads(model, serial, rtol=0, atol=1e-12):
    """Each sharded gradient, gathered, against the serial model's."""
    named = dict(serial.named_parameters())
    for name, p in model.named_parameters():
        full = dtensor_api.gather_dim(p.grad.array, 0, p.global_shape[0],
                                      p.device_mesh.get_group().comm)
        np.testing.assert_allclose(full, named[name].grad.array, rtol=rtol, atol=atol,
                                   err_msg=name)


def test_training_matches_serial_on_the_global_batch():
    model, serial = _models()
    _shard(model)
    assert isinstance(model, FSDPModule) and isinstance(model, C.Net)
    assert type(model).__name__ == "FSDPNet" and type(model.blocks[0]).__name__ == "FSDPBlock"
    size, rank = dist.get_world_size(), dist.get_rank()
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor) and p.placements == (Shard(0),), name
        rows = p.global_shape[0]
        step = -(-rows // size)
        assert p.to_local().shape[0] == max(0, min(step, rows - rank * step)), name
        assert p.device_mesh.size() == size
    _train(model, serial, steps=3)
    _assert_same_params(model, serial)


def test_unshard_and_reshard_swap_the_registered_parameters():
    model, serial = _models()
    _shard(model)
    block = model.blocks[1]
    block.unshard()
    assert not isinstance(block.up.weight, DTensor)
    np.testing.assert_array_equal(block.up.weight.array, serial.blocks[1].up.weight.array)
    block.reshard()
    assert isinstance(block.up.weight, DTensor)
    with torch.no_grad():  # no backward follows: even the root reshards
        model(_batch(0)[2])
    assert all(isinstance(p, DTensor) for p in model.parameters())
    model(_batch(0)[2])  # with a graph the root keeps its gathered parameters
    assert not isinstance(model.head.weight, DTensor)
    assert isinstance(model.blocks[0].up.weight, DTensor)


class Tied(nn.Module):
    """``head`` and ``proj`` share one weight, both in the root's unit."""

    def __init__(self):
        super().__init__()
        self.embed, self.block = nn.Linear(IN, D), C.Block(D, H)
        self.head, self.proj = nn.Linear(D, OUT), nn.Linear(D, OUT)
        self.proj.weight = self.head.weight

    def forward(self, x):
        h = self.block(self.embed(x))
        return self.head(h) + self.proj(torch.tanh(h))


def test_a_parameter_used_twice_in_one_unit_is_one_shard():
    torch.manual_seed(1)
    model, serial = Tied(), Tied()
    model.load_state_dict({k: v.clone() for k, v in serial.state_dict().items()})
    fully_shard(model.block)
    fully_shard(model)
    assert model.head.weight is model.proj.weight and isinstance(model.proj.weight, DTensor)
    _train(model, serial, steps=2)
    _assert_same_params(model, serial)
    other = Tied()
    other.embed.bias = other.block.down.bias
    fully_shard(other.block)
    with pytest.raises(NotImplementedError, match="shared with an already fully_shard-ed"):
        fully_shard(other)


def test_no_gradient_sync_accumulates_locally_then_reduces_the_sum(monkeypatch):
    calls = []
    for method in ("reduce_scatter", "reduce_scatter_in_place"):
        real = getattr(BucketComm, method)
        monkeypatch.setattr(BucketComm, method,
                            lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    model, serial = _models()
    _shard(model)
    model.set_requires_gradient_sync(False)
    gx0, gy0, x0, y0 = _batch(0)
    _loss(model, x0, y0).backward()
    assert calls == [] and all(p.grad is None for p in model.parameters())
    model.set_requires_gradient_sync(True)
    gx1, gy1, x1, y1 = _batch(1)
    _loss(model, x1, y1).backward()
    # one reduce-scatter per unit, of the sums of both backward passes
    assert len(calls) == sum(isinstance(m, FSDPModule) for m in model.modules())
    (_loss(serial, gx0, gy0) + _loss(serial, gx1, gy1)).backward()
    _assert_same_grads(model, serial)


def test_full_and_sharded_model_state_dicts():
    model, serial = _models()
    _shard(model)
    _train(model, serial, steps=2)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    plain = serial.state_dict()
    assert list(full) == list(plain)
    for key in plain:
        assert not isinstance(full[key], DTensor)
        np.testing.assert_allclose(full[key].array, plain[key].array, rtol=0, atol=1e-12)
    sharded = get_model_state_dict(model)
    assert all(isinstance(sharded[k], DTensor) for k, _ in serial.named_parameters())
    # the sharded state shares the shards' memory (as state_dict()): keep a copy
    saved = {k: DTensor(v.array.copy(), v.device_mesh, v.placements, v.global_shape)
             if isinstance(v, DTensor) else v.clone() for k, v in sharded.items()}
    # load a different model's full state, then the sharded state saved before it
    other, _ = _models(seed=7)
    set_model_state_dict(model, other.state_dict(),
                         options=StateDictOptions(full_state_dict=True))
    _assert_same_params(model, other, atol=0)
    set_model_state_dict(model, saved)
    _assert_same_params(model, serial)


def test_optimizer_state_round_trip_continues_training():
    model, serial = _models()
    _shard(model)
    opt, ref = _train(model, serial, steps=2)
    options = StateDictOptions(full_state_dict=True)
    model_state, optim_state = get_state_dict(model, opt, options=options)
    serial_names = {id(p): n for n, p in serial.named_parameters()}
    for p, entry in ref.state.items():
        saved = optim_state["state"][serial_names[id(p)]]
        np.testing.assert_allclose(saved["exp_avg"].array, entry["exp_avg"], rtol=0, atol=1e-12)
    assert optim_state["param_groups"][0]["params"] == [n for n, _ in serial.named_parameters()]
    fresh, _ = _models(seed=3)
    _shard(fresh)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.05)
    set_state_dict(fresh, fresh_opt, model_state_dict=model_state,
                   optim_state_dict=optim_state, options=options)
    sharded = get_optimizer_state_dict(fresh, fresh_opt)
    for name, _ in fresh.named_parameters():
        assert isinstance(sharded["state"][name]["exp_avg"], DTensor)
    gx, gy, x, y = _batch(5)
    for m, o, xx, yy in ((fresh, fresh_opt, x, y), (serial, ref, gx, gy)):
        o.zero_grad()
        _loss(m, xx, yy).backward()
        o.step()
    _assert_same_params(fresh, serial)
    # the sharded optimizer state loads back too
    set_optimizer_state_dict(fresh, fresh_opt, sharded)
    again = get_optimizer_state_dict(fresh, fresh_opt, options=options)
    for name, entry in optim_state["state"].items():
        assert again["state"][name]["exp_avg"].array.shape == entry["exp_avg"].array.shape


@pytest.mark.parametrize("wrap", ["plain", "ddp", "fsdp1"])
def test_state_dict_helpers_see_through_wrappers(wrap):
    model, serial = _models()
    if wrap == "ddp":
        model = DistributedDataParallel(model)
    elif wrap == "fsdp1":
        model = FullyShardedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    gx, gy, x, y = _batch(0)
    if wrap == "plain":  # no data parallelism: every rank trains on the global batch
        x, y = gx, gy
    _loss(model, x, y).backward()
    opt.step()
    ref = torch.optim.AdamW(serial.parameters(), lr=0.05)
    _loss(serial, gx, gy).backward()
    ref.step()
    options = StateDictOptions(full_state_dict=True)
    state, optim_state = get_state_dict(model, opt, options=options)
    assert list(state) == list(serial.state_dict())
    for key, value in serial.state_dict().items():
        np.testing.assert_allclose(np.asarray(getattr(state[key], "array", state[key])),
                                   value.array, rtol=0, atol=1e-12)
    names = [n for n, _ in serial.named_parameters()]
    assert sorted(optim_state["state"]) == sorted(names)
    set_state_dict(model, opt, model_state_dict=state, optim_state_dict=optim_state,
                   options=options)
    if wrap == "fsdp1":
        with pytest.raises(NotImplementedError, match="full_state_dict=True"):
            get_model_state_dict(model)


def test_mixed_precision_computes_in_param_dtype_and_keeps_float64_shards():
    model, serial = _models()
    _shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32,
                                                 reduce_dtype=torch.float64))
    gx, gy, x, y = _batch(0)
    out = model(x)
    assert out.dtype == torch.float32
    ((out - y) ** 2).mean().backward()
    serial32 = _net()
    serial32.load_state_dict({k: v.to(torch.float32) for k, v in serial.state_dict().items()})
    serial32 = serial32.float()
    _loss(serial32, gx.to(torch.float32), gy.to(torch.float32)).backward()
    for p in model.parameters():
        assert p.dtype == torch.float64 and p.grad.dtype == torch.float64
    _assert_same_grads(model, serial32, rtol=1e-4, atol=1e-6)


def test_refused_options_raise():
    with pytest.raises(TypeError, match="param_dtype"):
        MixedPrecisionPolicy(param_dtype=np.int32)
    with pytest.raises(TypeError, match="offload_policy"):
        fully_shard(_net(), offload_policy=CPUOffloadPolicy)
    with pytest.raises(ValueError, match="3-D mesh"):
        fully_shard(_net(), mesh=init_device_mesh("cpu", (1, 1, dist.get_world_size())))
    with pytest.raises(ValueError, match="should be a factor of"):
        fully_shard(_net(), reshard_after_forward=dist.get_world_size() + 1)
    with pytest.raises(NotImplementedError, match="flatten_optimizer_state_dict"):
        get_optimizer_state_dict(_net(), [], options=StateDictOptions(
            flatten_optimizer_state_dict=True))


def test_dtensor_and_device_mesh_basics():
    size, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("dp",))
    assert mesh.size() == size and mesh.get_local_rank() == rank
    assert mesh.get_group().size() == size and mesh["dp"].size() == size
    full = np.arange(17 * 2, dtype=np.float64).reshape(17, 2) + 100 * rank  # rank 0's wins
    t = distribute_tensor(torch.tensor(full), mesh, [Shard(0)])
    step = -(-17 // size)
    start, stop = min(rank * step, 17), min((rank + 1) * step, 17)
    assert t.to_local().shape == (stop - start, 2)
    expected = np.arange(17 * 2, dtype=np.float64).reshape(17, 2)
    np.testing.assert_array_equal(t.to_local().array, expected[start:stop])
    np.testing.assert_array_equal(t.full_tensor().array, expected)
    cols = distribute_tensor(torch.tensor(expected), mesh, [Shard(1)])
    np.testing.assert_array_equal(cols.full_tensor().array, expected)
    rep = distribute_tensor(torch.tensor(expected), mesh, [Replicate()])
    np.testing.assert_array_equal(rep.to_local().array, expected)
    joined = DTensor.from_local(torch.tensor(expected[start:stop]), mesh, [Shard(0)])
    assert joined.global_shape == (17, 2)
    np.testing.assert_array_equal(joined.full_tensor().array, expected)


def test_cpu_offload_and_broadcast_from_rank0():
    model, serial = _models()
    _shard(model)
    rank = dist.get_rank()
    offloaded = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))
    assert (offloaded == {}) == (rank != 0)  # PyTorch: only rank 0 holds the full state
    other, _ = _models(seed=9)
    given = other.state_dict() if rank == 0 else {}
    set_model_state_dict(model, given, options=StateDictOptions(full_state_dict=True,
                                                                broadcast_from_rank0=True))
    _assert_same_params(model, other, atol=0)
    with pytest.raises(ValueError, match="broadcast_from_rank0"):
        set_model_state_dict(model, given, options=StateDictOptions(broadcast_from_rank0=True))


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clip_grad_norm_takes_the_norm_of_the_whole_gradients(norm_type):
    model, serial = _models()
    _shard(model)
    gx, gy, x, y = _batch(0)
    _loss(model, x, y).backward()
    _loss(serial, gx, gy).backward()
    total = nn.utils.clip_grad_norm_(model.parameters(), 0.01, norm_type)
    expected = nn.utils.clip_grad_norm_(serial.parameters(), 0.01, norm_type)
    assert abs(float(total) - float(expected)) <= 1e-12 * float(expected)
    _assert_same_grads(model, serial, atol=1e-14)
