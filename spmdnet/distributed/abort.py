"""One rank's uncaught exception ends the whole job, with the rank named.

Without this, the other ranks wait forever in their next collective (the
most repeated complaint of ChainerMN and mpi4py users). The hook prints the
traceback with every line prefixed ``[rank N] ``, flushes stdout and
stderr, waits ``ABORT_DELAY_S`` (so that other ranks failing at the same
moment are not cut mid-traceback) and calls ``COMM_WORLD.Abort(1)``; the
launcher then kills every rank.
"""
import os
import sys
import threading
import time
import traceback

from ._mpi import mpi

ABORT_DELAY_S = 0.3  # for the launcher to forward the output, too
_installed = {}


def _report_and_abort(exc_type, exc, tb, where=""):
    MPI = mpi()  # initialised already: the hook is installed by dist.init
    lines = "".join(traceback.format_exception(exc_type, exc, tb)).rstrip("\n").split("\n")
    head = f"uncaught exception{where}; aborting all {MPI.COMM_WORLD.Get_size()} ranks"
    abort_job([head] + lines)


def abort_job(lines, code=1):
    """Flush stdout, write ``lines`` to stderr tagged ``[rank N] ``, give the
    launcher (and ranks failing at the same moment) ``ABORT_DELAY_S`` to pass
    the output on, then ``COMM_WORLD.Abort(code)`` (only when size > 1)."""
    MPI = mpi()
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    try:
        sys.stdout.flush()  # whatever the program printed, first
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in lines))
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed or redirected stream: abort anyway
        pass
    finally:
        if size > 1:
            time.sleep(ABORT_DELAY_S)
            MPI.COMM_WORLD.Abort(code)


def exit_now(lines, code=1, wait_s=2.0):
    """``abort_job`` where MPI may no longer return: ``Abort`` is tried in a
    thread; after ``wait_s`` this process exits with ``code`` on its own (the
    launcher then ends the other ranks, as for any rank that fails)."""
    MPI = mpi()
    rank = MPI.COMM_WORLD.Get_rank()
    try:
        sys.stdout.flush()
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in lines))
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    finally:
        threading.Thread(target=MPI.COMM_WORLD.Abort, args=(code,), daemon=True).start()
        time.sleep(wait_s)
        os._exit(code)


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
