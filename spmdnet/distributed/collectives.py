"""Collectives on NumPy/CuPy arrays and Tensors, in place where possible.

Every call synchronises the CUDA stream before a device buffer reaches MPI
(mpi4py does not), and stages device buffers through pinned host memory when
the MPI library is not CUDA-aware (see ``transport``). Tensors are reduced
through their ``.array``; these collectives record no autograd graph (the
differentiable ones live in ``spmdnet.parallel``).
"""
import numpy as np

from .. import backend
from ..errors import DistributedError
from .._tensor import Tensor
from .checks import check_same
from .guard import guarded
from ._mpi import mpi
from .runtime import comm_or_default
from .transport import cuda_aware

_OPS = ("sum", "mean", "max", "min")


class ReduceTypeError(TypeError, RuntimeError):
    """A reduction the dtype cannot take (an integer average, a bitwise op on
    floats): a TypeError, and the RuntimeError PyTorch raises for it."""


def integer_average(what, dtype):
    """The error of an average of integers: one rule for arrays, tensors and
    Python ints, PyTorch's (``ReduceOp.AVG`` on an integer tensor raises)."""
    return ReduceTypeError(f"{what}: an average needs a floating dtype, got {dtype} (an "
                           "integer average raises, as PyTorch's ReduceOp.AVG does); "
                           "reduce floats, or use op='sum' and divide")


def _mpi_op(op):
    if op not in _OPS:
        raise ValueError(f"op must be one of {_OPS}, got {op!r}")
    MPI = mpi()
    return {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]


def tensor_array(x, name):
    if isinstance(x, Tensor):
        return x.array
    if isinstance(x, np.ndarray) or backend.is_cupy_array(x):
        return x
    raise TypeError(f"{name} expects a NumPy/CuPy array or a Tensor, got {type(x).__name__}")


def on_host(arr, fn):
    """Run the in-place MPI call ``fn(buffer)`` on ``arr`` (NumPy or CuPy),
    writing the result back into ``arr``; e.g. ``dist.on_host(flat, lambda b:
    comm.Allgather(dist.mpi().IN_PLACE, b))``. Use it for every raw buffer
    call on a device array.

    NumPy: directly when C-contiguous, else through a contiguous copy.
    CuPy: after a stream sync, directly (CUDA-aware) or via a pinned buffer."""
    if backend.is_cupy_array(arr):
        backend.sync(arr)
        if cuda_aware() and arr.flags.c_contiguous:
            return fn(arr)
        host = backend.pinned_like(arr)
        arr.get(out=host)
        fn(host)
        arr.set(host)
        return None
    if arr.flags.c_contiguous and arr.flags.writeable:
        return fn(arr)
    tmp = np.ascontiguousarray(arr)
    fn(tmp)
    arr[...] = tmp
    return None


def to_host(arr):
    """A buffer MPI may read: arr itself, or a contiguous/host copy of it."""
    if backend.is_cupy_array(arr):
        backend.sync(arr)
        if cuda_aware() and arr.flags.c_contiguous:
            return arr
        return backend.asnumpy(arr)
    return np.ascontiguousarray(arr)


def allreduce(x, op="sum", comm=None):
    """Reduce ``x`` over the communicator's ranks, in place; returns ``x``.

    ``op``: "sum", "mean" (floating dtypes only), "max" or "min". A Python
    or NumPy scalar (immutable) gives a new scalar of the same type; the
    mean of integers raises TypeError, for scalars as for arrays."""
    if isinstance(x, (int, float, np.generic)) and not isinstance(x, bool):
        return type(x)(allreduce(np.array(x), op, comm)[()])
    arr = tensor_array(x, "allreduce")
    mpi_op = _mpi_op(op)
    comm = comm_or_default(comm)
    if op == "mean" and arr.dtype.kind not in "fc":
        raise integer_average("allreduce(op='mean')", arr.dtype)
    if not getattr(arr.flags, "writeable", True):  # CuPy arrays have no read-only flag
        raise ValueError("allreduce works in place: the array is read-only")
    with guarded(f"allreduce({op})", comm, arr):
        on_host(arr, lambda buf: comm.Allreduce(mpi().IN_PLACE, buf, mpi_op))
    if op == "mean":
        arr /= comm.Get_size()
    return x


def bcast(x, root=0, comm=None):
    """Rank ``root``'s array into ``x`` on every rank (in place); returns ``x``.
    Any other picklable object is broadcast by value and returned.
    (``dist.broadcast`` is PyTorch's ``broadcast(tensor, src, group)``.)"""
    comm = comm_or_default(comm)
    if not 0 <= root < comm.Get_size():
        raise ValueError(f"broadcast root {root} is outside [0, {comm.Get_size()})")
    if not isinstance(x, (Tensor, np.ndarray)) and not backend.is_cupy_array(x):
        with guarded("broadcast(object)", comm):
            return comm.bcast(x, root=root)
    arr = tensor_array(x, "broadcast")
    with guarded(f"broadcast(root={root})", comm, arr):
        on_host(arr, lambda buf: comm.Bcast(buf, root=root))
    return x


def allgather(x, comm=None, *, same_shape=False):
    """Every rank's ``x`` stacked into a new array of shape (size, *x.shape).

    The input is untouched. Ranks must pass equal shapes and dtypes: checked
    across ranks (one small collective more) unless ``same_shape`` says the
    caller's layout makes them equal (a row of fixed length per layer)."""
    arr = tensor_array(x, "allgather")
    comm = comm_or_default(comm)
    if not same_shape:
        check_same(comm, (tuple(arr.shape), str(arr.dtype)), "allgather (shape, dtype)")
    xp = backend.xp_of(arr)
    out = xp.empty((comm.Get_size(),) + arr.shape, arr.dtype)
    send = to_host(arr)
    with guarded("allgather", comm, arr):
        on_host(out, lambda buf: comm.Allgather(send, buf))
    return Tensor(out) if isinstance(x, Tensor) else out


def reduce_scatter_block(x, op="sum", comm=None):
    """Reduce ``x`` over ranks and return this rank's block of axis 0 (MPI's
    ``Reduce_scatter_block``; ``dist.reduce_scatter`` is PyTorch's).

    ``x.shape[0]`` must be divisible by the communicator size; rank r gets
    rows [r*n/size, (r+1)*n/size) of the reduction. The input is untouched."""
    arr = tensor_array(x, "reduce_scatter")
    mpi_op = _mpi_op(op)
    comm = comm_or_default(comm)
    size = comm.Get_size()
    if arr.ndim == 0 or arr.shape[0] % size:
        raise ValueError(f"reduce_scatter: axis 0 of shape {arr.shape} is not divisible "
                         f"by the {size} ranks")
    if op == "mean" and arr.dtype.kind not in "fc":
        raise integer_average("reduce_scatter(op='mean')", arr.dtype)
    out = backend.xp_of(arr).empty((arr.shape[0] // size,) + arr.shape[1:], arr.dtype)
    send = to_host(arr)
    with guarded(f"reduce_scatter({op})", comm, arr):
        on_host(out, lambda buf: comm.Reduce_scatter_block(send, buf, mpi_op))
    if op == "mean":
        out /= size
    return Tensor(out) if isinstance(x, Tensor) else out


__all__ = ["allreduce", "bcast", "allgather", "reduce_scatter_block", "on_host", "to_host",
           "tensor_array", "ReduceTypeError", "DistributedError"]
