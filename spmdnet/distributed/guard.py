"""Every collective passes through ``guarded(...)``: sequence numbers, the
collective check mode and the stall watchdog hang off this one place.

- ``SPMDNET_DEBUG_COLLECTIVES=1``: before each collective the ranks compare
  (sequence number, op, shape, dtype) with an allgather and raise
  DistributedError on every rank, with the per-rank table (call sites
  included), when they differ: a mismatch becomes an error, not a hang.
- ``SPMDNET_WATCHDOG_S=N``: a collective waiting longer than N seconds makes
  the waiting rank ask every rank what it is doing (see ``watchdog``) and
  print which collective, its sequence number, the call site and the ranks
  that have not arrived; after ``SPMDNET_WATCHDOG_ABORT_S`` (default 2N) the
  job is aborted with that report instead of burning the allocation.
Both are read at ``dist.init()``; with both off a collective costs one
counter increment here.
"""
import contextlib
import os
import sys
import threading
import time

from .. import config
from ..errors import DistributedError

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONTEXTLIB = os.path.abspath(contextlib.__file__)
_settings = {"debug": False, "watchdog_s": None, "abort_s": None}
_seq = {}
_lock = threading.Lock()
state = {"pending": None, "last": None}  # read by the watchdog thread


def configure():
    """Read the knobs (called by ``dist.init``); returns the watchdog limit or None."""
    _settings["debug"] = config.get_bool("SPMDNET_DEBUG_COLLECTIVES", False)
    limit = config.get("SPMDNET_WATCHDOG_S")
    _settings["watchdog_s"] = float(limit) if limit else None
    abort = config.get("SPMDNET_WATCHDOG_ABORT_S")
    if _settings["watchdog_s"] is not None:
        _settings["abort_s"] = float(abort) if abort else 2 * _settings["watchdog_s"]
    return _settings["watchdog_s"]


def settings():
    return dict(_settings)


def call_site():
    """'file:line in function' of the first caller outside spmdnet."""
    frame = sys._getframe(1)
    while frame is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _internal(filename):
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGE_DIR + os.sep) or path == _CONTEXTLIB


def comm_label(comm):
    try:
        name = comm.Get_name() or "comm"
    except Exception:  # a communicator without a name
        name = "comm"
    return f"{name}(size {comm.Get_size()})"


def _next_seq(comm):
    key = comm.py2f() if hasattr(comm, "py2f") else id(comm)
    with _lock:
        _seq[key] = _seq.get(key, 0) + 1
        return _seq[key]


@contextlib.contextmanager
def guarded(op, comm, array=None):
    """``with dist.guarded("allgather(my buffers)", comm, array):`` around one
    raw collective or point-to-point call on ``comm`` (``comm.Allgather``,
    ``comm.bcast``, ``comm.Send`` ...). Every rank of ``comm`` must pass
    through it in the same order: it numbers the call, and (when switched on,
    see the module docstring) checks that the ranks agree on ``op``, shape and
    dtype, and lets the watchdog name a stalled call. ``array``: the buffer,
    for the check; yields the call's sequence number."""
    seq = _next_seq(comm)
    if not (_settings["debug"] or _settings["watchdog_s"]):
        yield seq
        return
    site = call_site()
    shape = tuple(array.shape) if array is not None else None
    dtype = str(array.dtype) if array is not None else None
    if _settings["debug"]:
        check_matching(comm, seq, op, shape, dtype, site)
    entry = {"op": op, "seq": seq, "comm": comm_label(comm), "site": site,
             "shape": shape, "dtype": dtype, "since": time.time()}
    state["pending"] = entry
    try:
        yield seq
    finally:
        state["pending"] = None
        state["last"] = dict(entry, done=time.time())


def check_matching(comm, seq, op, shape, dtype, site):
    """Raise DistributedError on every rank unless all ranks are about to
    call the same collective (the check itself is one allgather)."""
    rows = comm.allgather((seq, op, shape, dtype, site))
    if all(r[:4] == rows[0][:4] for r in rows):
        return
    table = "\n".join(f"  rank {r}: #{s} {o} shape {sh} dtype {dt} at {st}"
                      for r, (s, o, sh, dt, st) in enumerate(rows))
    bad = next(r for r, row in enumerate(rows) if row[:4] != rows[0][:4])
    raise DistributedError(f"collective mismatch on {comm_label(comm)}: rank {bad} differs "
                           f"from rank 0\n{table}")
