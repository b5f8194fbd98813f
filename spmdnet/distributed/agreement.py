"""Ranks agree on what they pass to a collective, once per signature.

MPI does not check that the ranks of an ``Allreduce`` pass buffers of the
same dtype and length: a float32 tensor reduced with an int32 one gives
garbage and exit code 0, and a shape mismatch surfaces as MPI's "Message
truncated" (or a hang), naming no shape. ``agree(comm, what, array, op)``
before such a call compares (op, dtype, shape) across the ranks of ``comm``
the first time this rank passes that signature on ``comm``, and remembers
it: a training loop pays one small exchange per distinct signature, then a
set lookup per call. A disagreement raises DistributedError on every rank,
naming every rank's values.

The exchange runs on a private duplicate of ``comm`` (made on the first
exchange, which every rank reaches together: the first call misses on every
rank). A program in which only some ranks meet a new signature (the others
seen it before) leaves those ranks in the exchange and the others in the
collective: a hang that the stall watchdog reports, never a silent result.
"""
import threading

from ..errors import DistributedError

MAX_SIGNATURES = 4096  # per communicator; past it the memory is cleared (same on every rank)
_state = {}  # communicator handle -> {"dup": comm, "seen": set()}
_lock = threading.Lock()


def _key(comm):
    return comm.py2f() if hasattr(comm, "py2f") else id(comm)


def agree(comm, what, array, op=None):
    """Check that every rank of ``comm`` passes ``array`` of this dtype and
    shape (and the same ``op``) to ``what``; a no-op once agreed."""
    signature = (what, str(op) if op is not None else None, str(array.dtype),
                 tuple(int(n) for n in array.shape))
    entry = _state.get(_key(comm))
    if entry is not None and signature in entry["seen"]:
        return
    size = comm.Get_size()
    if size == 1:
        return
    with _lock:
        entry = _state.get(_key(comm))
        if entry is None:
            entry = _state[_key(comm)] = {"dup": comm.Dup(), "seen": set()}
    everyone = entry["dup"].allgather(signature)
    if any(s != signature for s in everyone):
        raise DistributedError(_describe(what, everyone, comm.Get_rank()))
    if len(entry["seen"]) >= MAX_SIGNATURES:
        entry["seen"].clear()
    entry["seen"].add(signature)


def _describe(what, everyone, me):
    parts = []
    for rank, (_, op, dtype, shape) in enumerate(everyone):
        parts.append(f"rank {rank}: {dtype} shape {shape}" + (f" op {op}" if op else "")
                     + (" (this rank)" if rank == me else ""))
    return (f"{what}: the ranks pass different tensors (every rank must pass the same "
            f"shape and dtype, and the same op): {'; '.join(parts)}")


def forget(comm):
    """Drop what is remembered for ``comm`` (freed: MPI reuses its handle)."""
    with _lock:
        entry = _state.pop(_key(comm), None)
    if entry is not None:
        try:
            entry["dup"].Free()
        except Exception:  # MPI finalized already: nothing to free
            pass


__all__ = ["agree", "forget"]
