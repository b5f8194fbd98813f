"""Ranks agree on what they pass to a collective, once per signature.

MPI does not check that the ranks of an ``Allreduce`` pass buffers of the
same dtype and length: a float32 tensor reduced with an int32 one gives
garbage and exit code 0, and a shape mismatch surfaces as MPI's "Message
truncated" (or a hang), naming no shape. ``agree(comm, what, array, op)``
before such a call (inside its ``guarded`` block, so that the watchdog and
the exit agreement see a rank waiting here as waiting in the collective)
compares (op, dtype, shape) across the ranks of ``comm``
the first time this rank passes that signature from that call site (the
program's line) on ``comm``, and remembers it: a training loop pays one
small exchange per call site and distinct signature, then a set lookup per
call. A disagreement raises DistributedError on every rank, naming every
rank's values. The call site is part of the key because ranks reach a new
line together: a mismatched call on a line of its own is caught even when
the ranks had reduced tensors of both kinds before.

Only torch.distributed's tensor API (``c10d_collectives.py``: what user
programs call) agrees: spmdnet's own array collectives, which the library's
strategies call from code paths that ranks legitimately reach at different
times (``join`` shadows the gradient reductions of ranks still training),
do not, since a signature cache is rank-local state and must never decide
whether a rank enters an extra collective there (a 4-rank ``join`` hung).

In the collective check mode (``SPMDNET_DEBUG_COLLECTIVES=1``), which
compares every call, this is skipped. The exchange runs on a private
duplicate of ``comm`` (made on the first exchange, which every rank reaches
together). A line that one rank reaches with a signature it has not passed
there before while the others repeat theirs leaves that rank in the
exchange and the others in the collective: a hang that the stall watchdog
reports, never a silent result.
"""
import threading

from ..errors import DistributedError
from . import guard

MAX_SIGNATURES = 4096  # per communicator; past it the memory is cleared (same on every rank)
_state = {}  # id(communicator) -> {"comm": it (kept, so the id stays its own), "dup", "seen"}
_lock = threading.Lock()


def _key(comm):
    return id(comm)


def agree(comm, what, array, op=None):
    """Check that every rank of ``comm`` calls the MPI collective ``what``
    ("allreduce", "broadcast" ...: one name whichever API called it) with
    ``array`` of one dtype and shape, and one ``op`` ("sum", "avg", "max",
    "from 2" ...); a no-op once agreed. Raises DistributedError on every
    rank otherwise."""
    if guard.debug_enabled():  # the check mode compares every call, call sites named
        return
    signature = (what, op, array.dtype, array.shape)  # str(dtype) costs ~20 us: not here
    entry = _state.get(_key(comm))
    seen_as = (guard.caller(2), signature)
    if entry is not None and seen_as in entry["seen"]:
        return
    size = comm.Get_size()
    if size == 1:
        return
    with _lock:
        entry = _state.get(_key(comm))
        if entry is None:
            entry = _state[_key(comm)] = {"comm": comm, "dup": comm.Dup(), "seen": set()}
    everyone = entry["dup"].allgather(signature)
    if any(s != signature for s in everyone):
        raise DistributedError(_describe(what, everyone, comm.Get_rank()))
    if len(entry["seen"]) >= MAX_SIGNATURES:
        entry["seen"].clear()
    entry["seen"].add(seen_as)


def _describe(what, everyone, me):
    parts = []
    for rank, (name, op, dtype, shape) in enumerate(everyone):
        call = f"{name}({op})" if op else name
        parts.append(f"rank {rank}: {call} of {dtype} shape {tuple(shape)}"
                     + (" (this rank)" if rank == me else ""))
    return (f"{what}: the ranks of the communicator disagree (every rank must call the "
            f"same collective with the same shape, dtype and op): {'; '.join(parts)}")


def forget(comm):
    """Drop what is remembered for ``comm`` (about to be freed)."""
    with _lock:
        entry = _state.pop(_key(comm), None)
    if entry is not None:
        try:
            entry["dup"].Free()
        except Exception:  # MPI finalized already: nothing to free
            pass


__all__ = ["agree", "forget"]
