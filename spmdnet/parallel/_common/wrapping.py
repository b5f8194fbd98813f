"""What the data-parallel wrappers (DataParallel, FullyShardedDataParallel)
share: the wrap-time check that every rank built the same model, the
backward sentinel that schedules the end-of-backward reduction, ``no_sync``,
and the ``nonfinite=`` check agreed by all ranks.
"""
import contextlib

from ... import distributed as dist
from ...autograd import Function
from ...backend import xp_of
from ...distributed.bucket_collectives import allgather_objects
from ...errors import DistributedError, NonFiniteError


def check_same_parameters(comm, named):
    """Raise DistributedError on every rank unless all ranks hold parameters
    with the same names, shapes and dtypes (in the same order)."""
    mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in named]
    everyone = allgather_objects(mine, comm, "allgather(DataParallel parameters)")
    for r, theirs in enumerate(everyone):
        if theirs == everyone[0]:
            continue
        for i in range(max(len(theirs), len(everyone[0]))):
            a = everyone[0][i] if i < len(everyone[0]) else None
            b = theirs[i] if i < len(theirs) else None
            if a != b:
                raise DistributedError(
                    f"DataParallel: ranks built different models; parameter #{i}: "
                    f"rank 0 has {_describe(a)}, rank {r} has {_describe(b)}")


def _describe(entry):
    if entry is None:
        return "no parameter"
    name, shape, dtype = entry
    return f"{name!r} shape {shape} dtype {dtype}"


def wrapping(model, comm):
    """(World, the base communicator, the model's trainable [(name, param)])
    for a wrapper over ``comm`` (None: the world, initialised); raises unless
    every rank built the same model."""
    world = dist.init() if comm is None else dist.world()
    base = comm if comm is not None else world.comm
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    check_same_parameters(base, named)
    return world, base, named


class BackwardSentinel(Function):
    """Identity on the model's output whose backward calls ``on_backward``
    (the wrapper schedules its end-of-backward reduction), so the reduction
    runs even when no parameter receives a gradient."""

    def forward(self, x, on_backward=None):
        self.on_backward = on_backward
        return x

    def backward(self, g):
        self.on_backward()
        return g


class NoSync:
    """``no_sync()`` for a wrapper that reduces gradients only while
    ``require_backward_grad_sync`` (DDP's attribute name) is True."""

    require_backward_grad_sync = True

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally, with no communication, inside the block;
        the first backward after it reduces the accumulated sum."""
        prev, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = prev


def nonfinite_mode(nonfinite):
    """The ``nonfinite=`` option checked ("ignore", "raise" or "skip"; None: "ignore")."""
    if nonfinite not in (None, "ignore", "raise", "skip"):
        raise ValueError(f"nonfinite must be 'ignore', 'raise' or 'skip', got {nonfinite!r}")
    return nonfinite or "ignore"


def nonfinite_names(arrays, names, whole=None):
    """Names of the ``arrays`` holding NaN or Inf: the one non-finite scan of
    every strategy. ``whole``: a flat array they are all views of, scanned
    first (one pass when everything is finite)."""
    if whole is not None and bool(xp_of(whole).isfinite(whole).all()):
        return []
    return [name for name, a in zip(names, arrays) if not bool(xp_of(a).isfinite(a).all())]


def agree_nonfinite(bad, mode, comm, step):
    """Whether every rank must drop this step's gradients: all ranks agree
    on whether any saw a non-finite local gradient (``bad``: this rank's
    parameter names); mode "raise" raises NonFiniteError on every rank,
    naming each rank and parameter, "skip" returns True (rank 0 logs it)."""
    if not dist.allreduce(int(bool(bad)), op="max", comm=comm):
        return False
    everyone = allgather_objects(list(bad), comm, "allgather(non-finite gradients)")
    table = [f"rank {r} parameter {name!r}" for r, names in enumerate(everyone)
             for name in names]
    at = "" if step is None else f" at step {step}"
    where = f"non-finite gradient{at}: " + ", ".join(table)
    if mode == "raise":
        raise NonFiniteError(where)
    if comm.Get_rank() == 0:
        dist.get_logger().warning("%s; step skipped on every rank", where)
    return True
