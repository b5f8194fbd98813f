"""allreduce_gradients: the explicit, hook-free way to average gradients."""
from .. import distributed as dist
from ..backend import xp_of


def allreduce_gradients(params, comm=None):
    """Average ``p.grad`` over the communicator for every parameter, in place.

    Parameters are taken in the given order (the same on every rank); one
    flat buffer per dtype is reduced with one Allreduce. A parameter with no
    gradient contributes zeros and receives the average."""
    comm = dist.comm_or_default(comm)
    params = [p for p in params if p.requires_grad]
    by_dtype = {}
    for p in params:
        by_dtype.setdefault(str(p.data.dtype), []).append(p)
    for dtype in sorted(by_dtype):
        group = by_dtype[dtype]
        xp = xp_of(group[0].data)
        flat = xp.zeros(sum(p.data.size for p in group), dtype=group[0].data.dtype)
        offset = 0
        for p in group:
            if p.grad is not None:
                flat[offset:offset + p.data.size] = p.grad.data.reshape(-1)
            offset += p.data.size
        dist.allreduce(flat, op="mean", comm=comm)
        offset = 0
        for p in group:
            chunk = flat[offset:offset + p.data.size].reshape(p.data.shape)
            if p.grad is None:
                p.grad = chunk.copy()
            else:
                p.grad.copy_(chunk)
            offset += p.data.size
