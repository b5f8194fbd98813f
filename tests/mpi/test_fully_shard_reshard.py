"""``fully_shard``'s reshard after forward: between forward and backward a
rank holds its shards and the root's gathered parameters, not the whole
model; backward all-gathers each unit again, and the numbers stay those of
serial training on the global batch (float64, 1 to 4 ranks).

Resident memory is the kernel's answer (``mincore`` on the pages of each
unit's unsharded storage), not spmdnet's bookkeeping."""
import ctypes
import mmap
import sys

import numpy as np
import pytest

import spmdnet as torch
import spmdnet.distributed as dist
from spmdnet import nn
from spmdnet.distributed.fsdp import fully_shard
from spmdnet.distributed.fsdp import _fsdp_state
from spmdnet.distributed.fsdp._fsdp_storage import UnshardedStorage
from spmdnet.distributed.tensor import DTensor
from spmdnet.distributed.tensor import _api as dtensor_api

from . import fully_shard_cases as C

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
IN, D, H, OUT, B, BLOCKS = 8, 48, 96, 3, 2, 3  # a Linear(D, H) weight spans 9 pages
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="mincore and MADV_DONTNEED as Linux has them")


def _models(**kwargs):
    return C.models(lambda: C.Net(IN, D, OUT, [C.Block(D, H) for _ in range(BLOCKS)]),
                    **kwargs)


def _batch(step):
    return C.batch(step, IN, OUT, B)


_loss = C.loss


_libc = ctypes.CDLL(None, use_errno=True)


def _resident_bytes(state):
    """Bytes of a unit's unsharded storage that are in physical memory."""
    if state.storage is None:
        return 0
    views = state.storage.views
    start = min(v.ctypes.data for v in views) // mmap.PAGESIZE * mmap.PAGESIZE
    end = max(v.ctypes.data + v.nbytes for v in views)
    pages = -(-(end - start) // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    if _libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * mmap.PAGESIZE), vec):
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec) * mmap.PAGESIZE


@linux_only
def test_storage_of_huge_pages_releases_and_refills():
    specs = [((512, 1024), np.float64), ((7,), np.float32)]  # 4 MiB: transparent huge pages
    storage = UnshardedStorage(specs, "cpu")
    values = [np.random.default_rng(0).standard_normal(s).astype(d) for s, d in specs]
    storage.fill(values)
    unit = type("Unit", (), {"storage": storage})
    assert storage.views[0].ctypes.data % (2 << 20) == 0
    assert _resident_bytes(unit) >= sum(v.nbytes for v in values)
    storage.release()
    assert _resident_bytes(unit) == 0 and not storage.resident
    storage.fill(values)
    for view, value in zip(storage.views, values):
        np.testing.assert_array_equal(view, value)


def _units(model):
    return [model.blocks[i]._fsdp_state for i in range(BLOCKS)], model._fsdp_state


def _check_training(model, serial, steps=2):
    C.train(model, serial, steps, _batch)
    C.assert_same_params(model, serial)


@linux_only
def test_between_forward_and_backward_only_shards_and_the_root_are_resident(monkeypatch):
    model, serial = _models()
    blocks, root = _units(model)
    full_bytes = sum(p.array.nbytes for p in serial.parameters())
    block_bytes = sum(p.array.nbytes for p in serial.blocks[0].parameters())
    root_bytes = full_bytes - BLOCKS * block_bytes
    size = dist.get_world_size()
    gathers = []
    real = dtensor_api.collectives.allgather
    monkeypatch.setattr(dtensor_api.collectives, "allgather",
                        lambda *a, **k: gathers.append(1) or real(*a, **k))
    seen = []  # units resident whenever a unit is gathered again in backward
    real_pre = _fsdp_state.FSDPState.pre_backward

    def pre_backward(state):
        real_pre(state)
        seen.append(sum(_resident_bytes(s) > 0 for s in blocks + [root]))
    monkeypatch.setattr(_fsdp_state.FSDPState, "pre_backward", pre_backward)
    for step in range(2):
        gx, gy, x, y = _batch(step)
        loss = _loss(model, x, y)
        assert all(isinstance(p, DTensor) for p in model.blocks.parameters())
        assert [_resident_bytes(s) for s in blocks] == [0] * BLOCKS
        page = mmap.PAGESIZE
        assert root_bytes <= _resident_bytes(root) <= root_bytes + 4 * page
        shards = sum(e.shard.array.nbytes for s in blocks + [root] for e in s.entries)
        assert shards <= -(-full_bytes // size) + 64 * page  # torch.chunk rounds rows up
        live = shards + sum(_resident_bytes(s) for s in blocks + [root])
        # the graph keeps no full block alive: a rank holds ~1/size of the model + the root
        assert live <= full_bytes / size + root_bytes + 68 * page
        if size > 1:
            assert live < full_bytes
        gathers.clear()
        loss.backward()
        if size > 1:  # every block's parameters all-gathered again, the root's not
            assert len(gathers) == BLOCKS * len(list(serial.blocks[0].parameters()))
        # each unit freed right after its backward: at most it and the root at once
        assert seen[-BLOCKS:] == [2] * BLOCKS
        assert [_resident_bytes(s) for s in blocks + [root]] == [0] * (BLOCKS + 1)
        (_loss(serial, gx, gy)).backward()
        named = dict(serial.named_parameters())
        for name, p in model.named_parameters():
            full = dtensor_api.gather_like(p, p.grad.array)
            np.testing.assert_allclose(full, named[name].grad.array, rtol=0, atol=1e-12,
                                       err_msg=name)
            p.grad = None
        serial.zero_grad()


@pytest.mark.parametrize("reshard", [True, False, None])
def test_training_matches_serial_for_every_reshard_after_forward(reshard):
    model, serial = _models(reshard_after_forward=reshard)
    _check_training(model, serial)


def _divisors():
    size = dist.get_world_size()
    return [k for k in range(1, size + 1) if size % k == 0]


def test_an_int_keeps_pieces_of_a_group_and_gathers_from_it(monkeypatch):
    size = dist.get_world_size()
    for k in _divisors():  # 1: stays unsharded, size: reshards fully, else pieces of k ranks
        model, serial = _models(reshard_after_forward=k)
        blocks, root = _units(model)
        comms = []
        real = dtensor_api.collectives.allgather
        monkeypatch.setattr(dtensor_api.collectives, "allgather",
                            lambda x, comm=None, real=real, comms=comms, **kw:
                            comms.append(comm.Get_size()) or real(x, comm, **kw))
        gx, gy, x, y = _batch(0)
        loss = _loss(model, x, y)
        for state in blocks + [root]:  # every unit, the root too
            assert state.filled == (k == 1), k
            for e in state.entries:
                if 1 < k < size:
                    step = -(-e.shard.global_shape[e.dim] // k)
                    assert e.kept is not None and e.kept.shape[e.dim] <= step, k
                else:
                    assert e.kept is None
        comms.clear()
        loss.backward()
        n_params = len(list(model.parameters()))
        if k == 1:
            assert comms == [], k  # nothing to gather again
        else:  # every parameter gathered again, from the group of k (k = size: all)
            assert comms == [k] * n_params, (k, comms)
        monkeypatch.undo()
        ref = dict(serial.named_parameters())
        _loss(serial, gx, gy).backward()
        for name, p in model.named_parameters():
            full = dtensor_api.gather_like(p, p.grad.array)
            np.testing.assert_allclose(full, ref[name].grad.array, rtol=0, atol=1e-12,
                                       err_msg=f"{name} k={k}")


def test_a_unit_whose_output_is_its_parameter_keeps_a_copy():
    class Emit(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.arange(6.0).reshape(3, 2))

        def forward(self):
            return self.w

    emit = Emit()
    holder = nn.ModuleList([emit])
    fully_shard(emit, reshard_after_forward=True)
    fully_shard(holder)
    out = emit()
    assert isinstance(emit.w, DTensor)
    np.testing.assert_array_equal(out.array, np.arange(6.0).reshape(3, 2))
    (out * out).sum().backward()
    full = dtensor_api.gather_like(emit.w, emit.w.grad.array)
    np.testing.assert_array_equal(full, 2 * np.arange(6.0).reshape(3, 2))


def test_frozen_parameters_stay_until_the_end_of_backward():
    model, serial = _models(reshard_after_forward=True)
    for m in (model, serial):
        m.blocks[1].norm.weight.requires_grad_(False)
    _check_training(model, serial)


def test_a_result_that_bypasses_the_output_raises_instead_of_reading_freed_parameters():
    class Stash(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(D, D)

        def forward(self, x):
            self.aux = self.lin(x).sum()  # reaches the loss beside the output
            return x * 2

    stash = Stash()
    outer = nn.Sequential(stash, nn.Linear(D, 1))
    fully_shard(stash, reshard_after_forward=True)
    fully_shard(outer)
    x = torch.tensor(np.ones((2, D)), requires_grad=True)
    loss = outer(x).sum() + stash.aux
    with pytest.raises(RuntimeError, match=r"gradient of lin\.(weight|bias) was computed"):
        loss.backward()


def test_a_no_grad_forward_before_backward_regathers_the_root():
    model, serial = _models()  # the root stays unsharded after a forward with a graph
    gx, gy, x, y = _batch(0)
    loss = _loss(model, x, y)
    with torch.no_grad():  # resharding even the root
        model(x)
    assert isinstance(model.head.weight, DTensor)
    loss.backward()
    _loss(serial, gx, gy).backward()
    named = dict(serial.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(dtensor_api.gather_like(p, p.grad.array),
                                   named[name].grad.array, rtol=0, atol=1e-12, err_msg=name)
