"""Differentiable collectives for tensor parallelism (Megatron's f and g).

Each is an ordinary autograd ``Function`` whose backward is the conjugate
collective, over the tensor-parallel communicator passed as ``comm=``:

================== ============================= ===============================
function           forward                       backward
================== ============================= ===============================
CopyToGroup (f)    identity                      allreduce (sum) over the group
ReduceFromGroup(g) allreduce (sum) over the group identity
GatherFromGroup    all-gather, concat last axis  keep this rank's slice
ScatterToGroup     keep this rank's slice        all-gather, concat last axis
================== ============================= ===============================

Convention: a tensor *replicated* over the group stands for one value, and
its gradient is the sum of the contributions of every rank's computation
(hence f's backward sums); a *split* tensor is the concatenation of the
ranks' slices along the last axis, rank t holding slice t. On a group of
one rank every function is the identity and nothing is communicated.

In the collective check mode (``SPMDNET_DEBUG_COLLECTIVES=1``) every place
where a replicated value enters the group (f's and the scatter's input, the
vocabulary-parallel layers' token ids and targets) compares a checksum of it
across the group (``check_replicated``): ranks of one tensor-parallel group
fed different samples (a sampler over the world instead of ``mesh.dp``)
raise DistributedError on every rank of the group, naming the ranks.

Communication goes through ``spmdnet.distributed`` (CUDA stream sync and host
staging included), looked up at call time so a benchmark can count bytes by
wrapping ``dist.allreduce`` / ``dist.allgather``.
"""
import numpy as np

from ... import distributed as dist
from ...backend import asnumpy, xp_of
from ...autograd import Function
from ...distributed import guard
from ...errors import DistributedError


def _width(n, comm, what):
    """The per-rank slice width of a last axis of length ``n``."""
    size = comm.Get_size()
    if n % size:
        raise ValueError(f"{what}: last axis of length {n} is not divisible by the "
                         f"{size} tensor-parallel ranks")
    return n // size


def _own_slice(x, comm, what):
    """This rank's slice of the last axis, as a new contiguous array."""
    w = _width(x.shape[-1], comm, what)
    r = comm.Get_rank()
    return xp_of(x).ascontiguousarray(x[..., r * w:(r + 1) * w])


def _gather_last(x, comm):
    """Every rank's ``x`` concatenated along the last axis, in rank order."""
    parts = dist.allgather(x, comm=comm)  # (size, *x.shape)
    return xp_of(x).concatenate(list(parts), axis=-1)


def _fingerprint(x):
    """(shape, dtype, sum, position-weighted sum, sum of |x|) of an array, in float64."""
    host = np.asarray(asnumpy(x)).reshape(-1)
    values = host.astype(np.float64) if host.dtype.kind in "biufc" else np.zeros(0)
    weights = np.arange(1, values.size + 1, dtype=np.float64) / max(values.size, 1)
    return (tuple(x.shape), str(x.dtype), float(values.sum()), float(values @ weights),
            float(np.abs(values).sum()))


def _same_values(a, b):
    """Equal up to the rounding of a reduction done in another order."""
    if a[:2] != b[:2]:
        return False
    tol = 1e-5 * (a[4] + b[4]) + 1e-30
    return all(abs(u - v) <= tol or (u != u and v != v) for u, v in zip(a[2:4], b[2:4]))


def check_replicated(x, comm, what):
    """Check mode only (a no-op otherwise): DistributedError on every rank of
    ``comm`` unless all hold the same ``x`` (shape, dtype and a checksum)."""
    if comm.Get_size() == 1 or not guard.debug_enabled():
        return
    site = guard.format_site(guard.caller())
    with dist.guarded(f"allgather(tensor-parallel input check of {what})", comm):
        everyone = comm.allgather((_fingerprint(x), dist.world().rank))
    first, first_world = everyone[0]
    differ = [(r, w) for r, (f, w) in enumerate(everyone) if not _same_values(f, first)]
    if differ:
        ranks = ", ".join(f"rank {r} (world rank {w})" for r, w in differ)
        raise DistributedError(
            f"{what} at {site}: the ranks of the tensor-parallel group {guard.comm_label(comm)} "
            f"hold different inputs: {ranks} differ from rank 0 (world rank {first_world}); "
            f"(shape, dtype, sum) per rank: {[f[:3] for f, _ in everyone]}. The ranks of one "
            "tensor-parallel group must see the same samples (a sampler over the world "
            "instead of mesh.dp?)")


def _summed(x, comm):
    """A new array: the sum of ``x`` over the group (x itself is untouched)."""
    out = x.copy()
    return dist.allreduce(out, op="sum", comm=comm)


class CopyToGroup(Function):
    """f: identity forward, allreduce-sum backward.

    Enters a tensor-parallel region with a replicated input: each rank's
    layer uses x for its own slice of the output, so dL/dx is the sum of the
    ranks' partial gradients."""

    def forward(self, x, comm=None):
        self.comm = comm
        check_replicated(x, comm, "the input of a tensor-parallel layer (copy_to_group)")
        return x

    def backward(self, g):
        return g if self.comm.Get_size() == 1 else _summed(g, self.comm)


class ReduceFromGroup(Function):
    """g: allreduce-sum forward, identity backward.

    Leaves a tensor-parallel region: every rank holds a partial sum (a row
    layer's product on its input slice); the output is replicated, and each
    partial sum's gradient is the output's gradient."""

    def forward(self, x, comm=None):
        return x if comm.Get_size() == 1 else _summed(x, comm)

    def backward(self, g):
        return g


class GatherFromGroup(Function):
    """All-gather along the last axis forward, own slice backward.

    Turns a split tensor into a replicated one; the gradient of rank t's
    slice is slice t of the (replicated) output gradient."""

    def forward(self, x, comm=None):
        self.comm = comm
        return x if comm.Get_size() == 1 else _gather_last(x, comm)

    def backward(self, g):
        if self.comm.Get_size() == 1:
            return g
        return _own_slice(g, self.comm, "GatherFromGroup backward")


class ScatterToGroup(Function):
    """Own slice of the last axis forward, all-gather backward.

    Turns a replicated tensor into a split one; the gradient of the whole
    input is the concatenation of every rank's slice gradient."""

    def forward(self, x, comm=None):
        self.comm = comm
        check_replicated(x, comm, "the input of a tensor-parallel layer (scatter_to_group)")
        return x if comm.Get_size() == 1 else _own_slice(x, comm, "scatter_to_group")

    def backward(self, g):
        return g if self.comm.Get_size() == 1 else _gather_last(g, self.comm)


def copy_to_group(x, comm):
    """Identity forward, allreduce backward (see ``CopyToGroup``)."""
    return CopyToGroup.apply(x, comm=comm)


def reduce_from_group(x, comm):
    """Allreduce forward, identity backward (see ``ReduceFromGroup``)."""
    return ReduceFromGroup.apply(x, comm=comm)


def gather_from_group(x, comm):
    """All-gather on the last axis forward, slice backward (``GatherFromGroup``)."""
    return GatherFromGroup.apply(x, comm=comm)


def scatter_to_group(x, comm):
    """Slice of the last axis forward, all-gather backward (``ScatterToGroup``)."""
    return ScatterToGroup.apply(x, comm=comm)
