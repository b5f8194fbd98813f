"""Collectives on arrays and Tensors: closed forms in rank and size, over
dtypes and shapes (0-d, odd length, 3-D, non-contiguous)."""
import os

import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as sn
from spmdnet import backend, dist

pytestmark = pytest.mark.mpi

DTYPES = [np.float32, np.float64, np.int32, np.int64]
SHAPES = [(), (17,), (2, 3, 4)]


@pytest.fixture(scope="module", autouse=True)
def world():
    return dist.init()


def ranks_array(shape, dtype, offset=0):
    """Every element of rank r holds r + offset + its flat index."""
    base = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return np.asarray(base + dist.rank() + offset).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_allreduce_ops_closed_form(dtype, shape):
    n, base = dist.size(), np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    expected = {"sum": n * base + n * (n - 1) / 2, "max": base + n - 1, "min": base}
    for op, want in expected.items():
        x = ranks_array(shape, dtype)
        out = dist.allreduce(x, op=op)
        assert out is x and x.dtype == dtype  # in place, dtype kept
        np.testing.assert_array_equal(x, want.astype(dtype))
    if np.dtype(dtype).kind == "f":
        x = ranks_array(shape, dtype)
        dist.allreduce(x, op="mean")
        np.testing.assert_allclose(x, base + (n - 1) / 2, rtol=1e-6)


def test_allreduce_scalars():
    n = dist.size()
    assert dist.allreduce(dist.rank() + 1) == n * (n + 1) // 2
    assert dist.allreduce(float(dist.rank()), op="mean") == (n - 1) / 2
    assert dist.allreduce(np.float32(dist.rank()), op="max") == np.float32(n - 1)


def test_allreduce_mean_rejects_integers():
    with pytest.raises(TypeError, match="floating"):
        dist.allreduce(np.zeros(3, np.int64), op="mean")


def test_allreduce_non_contiguous_in_place():
    full = np.zeros((4, 6))
    view = full[:, ::2]
    view[...] = dist.rank() + 1
    dist.allreduce(view)
    n = dist.size()
    np.testing.assert_array_equal(full[:, ::2], n * (n + 1) / 2)
    np.testing.assert_array_equal(full[:, 1::2], 0)  # the gaps are untouched


def test_allreduce_tensor():
    t = sn.tensor(np.full(5, float(dist.rank())))
    assert dist.allreduce(t, op="mean") is t
    np.testing.assert_allclose(t.numpy(), (dist.size() - 1) / 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_from_every_root(dtype):
    for root in range(dist.size()):
        x = ranks_array((3, 5), dtype)
        dist.bcast(x, root=root)
        np.testing.assert_array_equal(x, ranks_array((3, 5), dtype) - dist.rank() + root)
    assert dist.bcast({"r": dist.rank()}, root=0) == {"r": 0}  # any object


def test_broadcast_keeps_the_contracts_root_and_comm_spelling():
    # DESIGN's dist.broadcast(x, root=0, comm=None) is dist.bcast's keyword form;
    # PyTorch's broadcast(tensor, src) is tested in test_torch_distributed.py
    for root in range(dist.size()):
        x = ranks_array((4,), np.float64)
        assert dist.broadcast(x, root=root) is x
        np.testing.assert_array_equal(x, ranks_array((4,), np.float64) - dist.rank() + root)
    x = ranks_array((2,), np.int64)
    dist.broadcast(x)  # no source: root 0 (PyTorch refuses a call without src)
    np.testing.assert_array_equal(x, ranks_array((2,), np.int64) - dist.rank())
    assert dist.broadcast({"r": dist.rank()}, root=0, comm=None) == {"r": 0}
    with pytest.raises(TypeError, match="not both"):
        dist.broadcast(np.zeros(2), src=0, root=0)


def test_broadcast_bad_root():
    with pytest.raises(ValueError, match="outside"):
        dist.bcast(np.zeros(2), root=dist.size())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_allgather_stacks_ranks(dtype, shape):
    x = ranks_array(shape, dtype)
    before = x.copy()
    out = dist.allgather(x)
    assert out.shape == (dist.size(),) + shape
    for r in range(dist.size()):
        np.testing.assert_array_equal(out[r], ranks_array(shape, dtype, offset=r - dist.rank()))
    np.testing.assert_array_equal(x, before)  # input untouched


def test_allgather_shape_mismatch_raises_on_every_rank():
    x = np.zeros(3 if dist.rank() == 0 else 4)
    if dist.size() == 1:
        return
    with pytest.raises(sn.DistributedError, match="rank 1"):
        dist.allgather(x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_blocks(dtype):
    n, k = dist.size(), 3
    x = ranks_array((n * k, 2), dtype)
    before = x.copy()
    out = dist.reduce_scatter_block(x, op="sum")
    rows = np.arange(n * k * 2, dtype=np.float64).reshape(n * k, 2)
    want = (n * rows + n * (n - 1) / 2)[dist.rank() * k:(dist.rank() + 1) * k]
    np.testing.assert_array_equal(out, want.astype(dtype))
    np.testing.assert_array_equal(x, before)


def test_reduce_scatter_indivisible():
    with pytest.raises(ValueError, match="divisible"):
        dist.reduce_scatter_block(np.zeros(dist.size() + 1) if dist.size() > 1 else
                                  np.zeros(()))


def test_collectives_on_a_split_communicator():
    sub = MPI.COMM_WORLD.Split(color=dist.rank() % 2, key=dist.rank())
    x = np.array([float(dist.rank())])
    dist.allreduce(x, comm=sub)
    members = [r for r in range(dist.size()) if r % 2 == dist.rank() % 2]
    assert x[0] == sum(members)
    sub.Free()


def test_world_facts():
    w = dist.init()
    assert dist.init() is w  # idempotent
    assert w.size == MPI.COMM_WORLD.Get_size() and w.rank == MPI.COMM_WORLD.Get_rank()
    assert 0 <= dist.local_rank() < w.local_size <= w.size
    assert dist.is_root() == (dist.rank() == 0)
    # SPMDNET_DEVICE=auto (the default) binds a GPU where CuPy sees one
    gpu = backend.cupy_available() and os.environ.get("SPMDNET_DEVICE", "auto") != "cpu"
    assert w.device == ("gpu" if gpu else "cpu") == dist.bound_device()
