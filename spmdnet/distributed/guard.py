"""Every collective passes through ``guarded(...)``: sequence numbers, the
collective check mode and the stall watchdog hang off this one place.

- ``SPMDNET_DEBUG_COLLECTIVES=1``: before each collective every rank tells
  the other members of its communicator which collective it is entering
  (sequence number, op, shape, dtype, call site) and waits for theirs (see
  ``crosscheck``): a mismatch on the same communicator, or a member sitting
  in a collective on another communicator that includes this rank (the
  deadlock of ranks with different numbers of batches), raises
  DistributedError on those ranks, naming both call sites. A point-to-point
  wait (``wait_p2p``, the pipeline's sends and receives) counts as a place
  where a rank waits: a collective whose member waits in a receive from it
  is reported too.
- The stall watchdog (on by default, ``SPMDNET_WATCHDOG_S``): a collective
  waiting longer than the limit makes the waiting rank ask every rank what
  it is doing and print which collective, its sequence number, the call site
  and the ranks that have not arrived; after ``SPMDNET_WATCHDOG_ABORT_S`` the
  job is aborted with that report (see ``watchdog``).
Both are read at ``dist.init()``. A guarded call costs a counter increment
and, with the watchdog on, a few microseconds to note the call site.
"""
import contextlib
import functools
import os
import sys
import threading
import time

from .. import config
from ._mpi import mpi

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONTEXTLIB = os.path.abspath(contextlib.__file__)
WATCHDOG_S, ABORT_FACTOR = 300.0, 2.0   # defaults: report after 5 min, abort after 10
_settings = {"debug": False, "watchdog_s": None, "abort_s": None}
_seq = {}
_lock = threading.Lock()
_checker = {}  # "check": the CrossCheck of this process, set up by dist.init
state = {"pending": None, "last": None}  # read by the watchdog thread


def configure():
    """Read the knobs (``dist.init`` calls it); returns the watchdog limit or None (off)."""
    _settings["debug"] = config.get_bool("SPMDNET_DEBUG_COLLECTIVES", False)
    limit = config.get_seconds("SPMDNET_WATCHDOG_S", WATCHDOG_S)
    abort = config.get_seconds("SPMDNET_WATCHDOG_ABORT_S", ABORT_FACTOR * limit)
    _settings["watchdog_s"] = limit or None
    _settings["abort_s"] = (abort or None) if limit else None
    return _settings["watchdog_s"]


def set_checker(checker):
    _checker["check"] = checker


def register(comm):
    """A new communicator (collective over ``comm``; called where spmdnet
    creates one): its sequence numbers restart (MPI reuses the handles of
    freed communicators) and it gets a job-wide id for the check mode."""
    forget(comm)
    if "check" in _checker:
        _checker["check"].register(comm)


def forget(comm):
    with _lock:
        _seq.pop(comm.py2f(), None)
    if "check" in _checker:
        _checker["check"].forget(comm)


def settings():
    return dict(_settings)


def debug_enabled():
    """Whether the collective check mode (``SPMDNET_DEBUG_COLLECTIVES=1``) is on."""
    return _settings["debug"]


@functools.cache
def _internal(filename):
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGE_DIR + os.sep) or path == _CONTEXTLIB


def caller(depth=1):
    """(file, line, function) of the first caller outside spmdnet, or None."""
    frame = sys._getframe(depth)
    while frame is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back
    return None if frame is None else (frame.f_code.co_filename, frame.f_lineno,
                                       frame.f_code.co_name)


def format_site(site):
    return "?" if site is None else f"{site[0]}:{site[1]} in {site[2]}"


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
def guarded(op, comm, array=None, peer=None):
    """``with dist.guarded("allgather(my buffers)", comm, array):`` around one
    raw collective call on ``comm`` (``comm.Allgather``, ``comm.bcast`` ...).
    Every rank of ``comm`` must pass through it in the same order: it numbers
    the call, and (when switched on, see the module docstring) checks that
    the ranks agree on ``op``, shape and dtype, and lets the watchdog name a
    stalled call. ``array``: the buffer, for the check. ``peer``: the other
    rank of a point-to-point call (``comm.Send``, ``comm.recv``): watched,
    but neither numbered nor checked. Yields the call's sequence number."""
    seq = _next_seq(comm) if peer is None else 0
    if not (_settings["debug"] or _settings["watchdog_s"]):
        yield seq
        return
    site = caller(3)  # past contextlib's __enter__ and this generator
    shape = tuple(array.shape) if array is not None else None
    dtype = str(array.dtype) if array is not None else None
    entry = {"op": op if peer is None else f"{op} with rank {peer}", "seq": seq,
             "comm": comm, "site": site, "shape": shape, "dtype": dtype,
             "since": time.time()}
    state["pending"] = entry
    try:
        if _settings["debug"] and peer is None and "check" in _checker:
            _checker["check"].check(comm, seq, op, shape, dtype, format_site(site))
        yield seq
    finally:
        state["pending"] = None
        state["last"] = entry
        entry["done"] = time.time()


def wait_p2p(comm, peer, op, direction, tag, done):
    """Inside ``guarded(op, comm, peer=peer)``, before a point-to-point call
    that may block: in check mode, poll ``done()`` (e.g. ``comm.Iprobe`` for
    a receive, ``request.Test`` for a send), telling the peer after a moment
    that this rank waits for it, and raise DistributedError as soon as the
    peer is seen waiting for this rank elsewhere (see ``crosscheck``).
    Otherwise returns at once. ``direction``: "send" or "recv"."""
    if _settings["debug"] and "check" in _checker:
        _checker["check"].wait_p2p(comm, peer, op, direction, tag, done,
                                   format_site(caller()))


def snapshot():
    """This rank's collective state as plain, picklable data (for the watchdog)."""
    return {key: plain(state[key]) for key in ("pending", "last")}


def plain(entry):
    """A state entry with its communicator and call site as text (or None),
    and the communicator's members as world ranks (``comm_members``)."""
    if entry is None:
        return None
    return dict(entry, comm=comm_label(entry["comm"]), members=comm_members(entry["comm"]),
                site=format_site(entry["site"]))


def comm_members(comm):
    """The world ranks of ``comm``'s members, in its rank order, or None
    (no MPI group). Unnamed communicators share one label ("comm(size 2)"
    for every pair of a mesh): with the members, two ranks' states name the
    same communicator only when its members are the same too. A local call."""
    try:
        group, world = comm.Get_group(), mpi().COMM_WORLD.Get_group()
        try:
            return tuple(group.Translate_ranks(list(range(comm.Get_size())), world))
        finally:
            group.Free()
            world.Free()
    except Exception:  # not an MPI communicator (a stand-in), or MPI is gone
        return None
