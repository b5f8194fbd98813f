"""allreduce_gradients: the explicit, hook-free way to average gradients."""
from ... import distributed as dist
from ...backend import xp_of
from .._common.flat import FlatLayout


def allreduce_gradients(params, comm=None):
    """Average ``p.grad`` over the communicator for every parameter, in place.

    Parameters are taken in the given order (the same on every rank); one
    flat buffer per dtype is reduced with one Allreduce. A parameter with no
    gradient contributes zeros and receives the average."""
    comm = dist.comm_or_default(comm)
    params = [p for p in params if p.requires_grad]
    by_dtype = {}
    for p in params:
        by_dtype.setdefault(str(p.array.dtype), []).append(p)
    for dtype in sorted(by_dtype):
        group = by_dtype[dtype]
        layout = FlatLayout([p.array.shape for p in group])
        flat = xp_of(group[0].array).zeros(layout.numel, dtype=group[0].array.dtype)
        layout.pack(flat, [None if p.grad is None else p.grad.array for p in group])
        dist.allreduce(flat, op="mean", comm=comm)
        for p, chunk in zip(group, layout.views(flat)):
            if p.grad is None:
                p.grad = chunk.copy()
            else:
                p.grad.copy_(chunk)
