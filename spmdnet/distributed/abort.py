"""One rank's uncaught exception ends the whole job, with the rank named.

Without this, the other ranks wait forever in their next collective (the
most repeated complaint of ChainerMN and mpi4py users). The hook prints the
traceback with every line prefixed ``[rank N] `` and calls
``COMM_WORLD.Abort(1)``; the launcher then kills every rank.
"""
import sys
import threading
import traceback

from ._mpi import mpi

_installed = {}


def _report_and_abort(exc_type, exc, tb, where=""):
    MPI = mpi()  # initialised already: the hook is installed by dist.init
    rank = MPI.COMM_WORLD.Get_rank()
    size = MPI.COMM_WORLD.Get_size()
    lines = "".join(traceback.format_exception(exc_type, exc, tb)).rstrip("\n").split("\n")
    head = f"uncaught exception{where}; aborting all {size} ranks"
    text = "\n".join(f"[rank {rank}] {line}" for line in [head] + lines)
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    finally:
        if size > 1:
            MPI.COMM_WORLD.Abort(1)


def _excepthook(exc_type, exc, tb):
    if issubclass(exc_type, KeyboardInterrupt):
        return _installed["sys"](exc_type, exc, tb)
    _report_and_abort(exc_type, exc, tb)


def _thread_excepthook(args):
    if args.exc_type is SystemExit:
        return
    name = getattr(args.thread, "name", "?")
    _report_and_abort(args.exc_type, args.exc_value, args.exc_traceback,
                      where=f" in thread {name!r}")


def install():
    """Install the hooks once (idempotent); ``uninstall`` restores the old ones."""
    if _installed:
        return
    _installed["sys"], _installed["thread"] = sys.excepthook, threading.excepthook
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook


def uninstall():
    if _installed:
        sys.excepthook, threading.excepthook = _installed.pop("sys"), _installed.pop("thread")
