"""``fully_shard``'s gradient reduction on the ``ParamAndGradBuffer``: each
unit's reduce-scatter starts at its post-backward and completes at the end of
backward; every rank gets exactly its ``torch.chunk`` piece of each
gradient (any sharded dimension, several dtypes in one unit), added to an
existing ``.grad``; the reduce dtype is the policy's. Against the serial
model on the global batch (float64; 1 to 4 ranks, widths that do not divide)."""
import numpy as np
import pytest

import spmdnet as torch
import spmdnet.distributed as dist
from spmdnet import nn
from spmdnet.distributed import bucket_collectives
from spmdnet.distributed.bucket_collectives import BucketComm
from spmdnet.distributed.device_mesh import init_device_mesh
from spmdnet.distributed.fsdp import MixedPrecisionPolicy, _fsdp_state, fully_shard
from spmdnet.distributed.tensor import Shard
from spmdnet.parallel._common.flat import ChunkLayout

from . import fully_shard_cases as C

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
IN, D, H, OUT, B = 4, 5, 7, 3, 2


class Block(nn.Module):
    """Two layers (the second float32 when ``mixed``) and a parameter no loss reaches."""

    def __init__(self, mixed):
        super().__init__()
        self.a = nn.Linear(D, H)
        self.b = nn.Linear(H, D).to(torch.float32 if mixed else torch.float64)
        self.unused = nn.Parameter(torch.ones(3, 2))

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return x + self.b(h.to(self.b.weight.dtype)).to(x.dtype)


def _models(mixed=False, **kwargs):
    return C.models(lambda: C.Net(IN, D, OUT, [Block(mixed), Block(mixed)]), **kwargs)


def _batch(step):
    return C.batch(step, IN, OUT, B, seed=7)


_loss = C.loss


def _check_pieces(model, serial, mixed=False):
    """Each rank's shard ``.grad`` is exactly its torch.chunk piece of the
    serial gradient (to 1e-12; to float32's rounding in a ``mixed`` model)."""
    named = dict(serial.named_parameters())
    for name, p in model.named_parameters():
        mesh, ref = p.device_mesh, named[name].grad
        size, rank = mesh.size(mesh.ndim - 1), mesh.get_coordinate()[-1]
        if ref is None:
            assert p.grad is None, name
            continue
        dim = p.placements[-1].dim
        piece = np.array_split(ref.array, [-(-ref.shape[dim] // size) * r
                                           for r in range(1, size)], axis=dim)[rank]
        assert p.grad.dtype == p.dtype and p.grad.shape == p.to_local().shape, name
        tol = {"rtol": 1e-5, "atol": 1e-7} if mixed else {"rtol": 0, "atol": 1e-12}
        np.testing.assert_allclose(p.grad.array, piece, err_msg=name, **tol)


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("dim", [0, 1])
def test_each_rank_gets_its_chunk_of_every_gradient_and_accumulates(dim, mixed):
    model, serial = _models(mixed, shard_placement_fn=lambda p: Shard(min(dim, p.ndim - 1)))
    for step in range(2):  # no zero_grad: the second backward adds to .grad
        gx, gy, x, y = _batch(step)
        _loss(model, x, y).backward()
        _loss(serial, gx, gy).backward()
        _check_pieces(model, serial, mixed)


def test_reduce_scatters_start_at_post_backward_and_complete_at_backward_end(monkeypatch):
    model, serial = _models(mixed=True)
    events = []
    for method in ("reduce_scatter", "reduce_scatter_in_place"):
        real = getattr(BucketComm, method)
        monkeypatch.setattr(BucketComm, method, lambda *a, _real=real, **k: (
            events.append("start"), _real(*a, **k))[1])
    real_all_reduce = BucketComm.all_reduce  # each unit's vote on which parameters got grads
    monkeypatch.setattr(BucketComm, "all_reduce", lambda *a, **k: (
        events.append("vote"), real_all_reduce(*a, **k))[1])
    real_wait = bucket_collectives.Work.wait
    monkeypatch.setattr(bucket_collectives.Work, "wait",
                        lambda self: events.append("wait") or real_wait(self))
    real_gather = _fsdp_state.gather_dim
    monkeypatch.setattr(_fsdp_state, "gather_dim",
                        lambda *a, **k: events.append("gather") or real_gather(*a, **k))
    gx, gy, x, y = _batch(0)
    loss = _loss(model, x, y)
    events.clear()
    loss.backward()
    starts = [i for i, e in enumerate(events) if e == "start"]
    # two blocks (each: a float64 and a float32 group) and the root; one vote per unit
    assert len(starts) == 2 * 2 + 1 and events.count("vote") == 3
    assert events.count("wait") == len(starts) + 3
    # the last block's reduce-scatters travel while the first block gathers and
    # runs its backward; every wait comes after the last start
    assert starts[0] < max(i for i, e in enumerate(events) if e == "gather")
    assert max(starts) < min(i for i, e in enumerate(events) if e == "wait")
    _loss(serial, gx, gy).backward()
    _check_pieces(model, serial, mixed=True)


@pytest.mark.parametrize("reduce_dtype", [None, torch.float64])
def test_gradients_are_reduced_in_the_reduce_dtype(monkeypatch, reduce_dtype):
    dtypes = []
    for method in ("reduce_scatter", "reduce_scatter_in_place"):
        real = getattr(BucketComm, method)
        monkeypatch.setattr(BucketComm, method, lambda self, buf, *a, _real=real, **k: (
            dtypes.append(buf.dtype), _real(self, buf, *a, **k))[1])
    model = nn.Sequential(nn.Linear(IN, D), nn.Tanh(), nn.Linear(D, OUT))
    policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=reduce_dtype)
    fully_shard(model[0], mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    _, _, x, y = _batch(0)
    _loss(model, x, y).backward()
    want = np.float32 if reduce_dtype is None else np.float64
    assert dtypes and all(d == want for d in dtypes), dtypes
    assert all(p.grad.dtype == p.dtype for p in model.parameters() if p.grad is not None)


def test_a_reduce_dtype_mpi_cannot_sum_is_refused():
    with pytest.raises(TypeError, match="bfloat16, which MPI cannot sum"):
        fully_shard(nn.Linear(2, 3), mp_policy=MixedPrecisionPolicy(param_dtype="bfloat16"))


def test_hsdp_with_no_sync_reduces_the_sum_over_all_ranks():
    size = dist.get_world_size()
    if size % 2:
        pytest.skip(f"a (2, {size}/2) mesh needs an even world size, got {size}")
    mesh = init_device_mesh("cpu", (2, size // 2))
    model, serial = _models(mesh=mesh)
    model.set_requires_gradient_sync(False)
    gx0, gy0, x0, y0 = _batch(0)
    _loss(model, x0, y0).backward()
    assert all(p.grad is None for p in model.parameters())
    model.set_requires_gradient_sync(True)
    gx1, gy1, x1, y1 = _batch(1)
    _loss(model, x1, y1).backward()
    (_loss(serial, gx0, gy0) + _loss(serial, gx1, gy1)).backward()
    _check_pieces(model, serial)


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_chunk_layout_puts_and_reads_torch_chunk_pieces(parts):
    rng = np.random.default_rng(parts)
    shapes, dims = [(5, 3), (7,), (2, 4, 3), (0, 2), (1, 6)], [0, 0, 1, 0, 1]
    layout = ChunkLayout(shapes, dims, parts)
    arrays = [rng.standard_normal(s) for s in shapes]
    flat = np.zeros(layout.padded_numel)
    for i, a in enumerate(arrays):
        layout.put(flat, i, a)
        layout.put(flat, i, a, add=True)
    for r in range(parts):
        shard = flat[slice(*layout.shard_range(r))]
        for i, a in enumerate(arrays):
            step = -(-a.shape[dims[i]] // parts)
            want = np.array_split(a, [step * k for k in range(1, parts)], axis=dims[i])[r]
            np.testing.assert_array_equal(layout.piece(shard, i, r), 2 * want)
