"""allreduce_gradients: the explicit, hook-free way to average gradients."""
from ... import distributed as dist
from ...backend import xp_of
from .._common.flat import FlatLayout
from .._common.wrapping import agree_nonfinite, nonfinite_mode, nonfinite_names


def allreduce_gradients(params, comm=None, nonfinite="ignore"):
    """Average ``p.grad`` over the communicator for every parameter, in place.

    Parameters are taken in the given order (the same on every rank); one
    flat buffer per dtype is reduced with one Allreduce. A parameter with no
    gradient contributes zeros and receives the average.

    ``nonfinite`` (DataParallel's option and default): "raise" or "skip"
    checks the local gradients first and all ranks agree: NonFiniteError on
    every rank naming rank and parameter, or every ``p.grad`` set to None
    (the optimizer skips the step). Returns True when the step was skipped."""
    comm = dist.comm_or_default(comm)
    params = [p for p in params if p.requires_grad]
    if nonfinite_mode(nonfinite) != "ignore":
        held = [(f"#{i} (shape {tuple(p.shape)})", p.grad.array)
                for i, p in enumerate(params) if p.grad is not None]
        bad = nonfinite_names([a for _, a in held], [n for n, _ in held])
        if agree_nonfinite(bad, nonfinite, comm, None):
            for p in params:
                p.grad = None
            return True
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
    return False
