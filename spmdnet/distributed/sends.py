"""Blocking sends that are never received are reported, not lost.

MPI completes a small ``Send`` at once, copying it into the receiver's
buffers whether or not the receiver ever posts a matching receive: a
``dist.send`` with no ``recv`` vanished silently and the job exited 0
(PyTorch's send fails). ``dist.send`` of at most ``SMALL_BYTES`` therefore
starts a synchronous-mode ``Issend`` of a private copy (it completes only
when the receiver has matched it) and returns, as a buffered send does;
``track`` keeps it. When every rank has reached its exit (``exits``), a
send still unmatched can never be received: ``report_unmatched`` names the
sender, the receiver, the tag and the data, and the rank exits with code 1.
A larger send is MPI's blocking ``Send``, which waits for the receiver.
"""
import sys
import threading
import time

SMALL_BYTES = 64 * 1024
SETTLE_S = 0.5  # after every rank has arrived, time for the last matches to be seen
_pending = []
_lock = threading.Lock()


def track(request, buffer, description):
    """Keep an ``Issend`` (and its buffer) until it is matched; forget the
    ones already matched."""
    with _lock:
        _pending[:] = [p for p in _pending if not p[0].Test()]
        _pending.append((request, buffer, description))


def unmatched(settle_s=SETTLE_S):
    """The descriptions of the tracked sends not matched within ``settle_s``."""
    deadline = time.monotonic() + settle_s
    while True:
        with _lock:
            _pending[:] = [p for p in _pending if not p[0].Test()]
            left = [p[2] for p in _pending]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.005)


def report_unmatched(rank, left):
    """Print ``left``, the sends nobody received (``unmatched()`` once every
    rank has reached its exit); returns True when there were any."""
    for what in left:
        sys.stderr.write(f"[rank {rank}] spmdnet: {what} was never received: the "
                         "program ended without a matching recv on that rank (the data "
                         "is lost)\n")
    sys.stderr.flush()
    return bool(left)


__all__ = ["SMALL_BYTES", "track", "unmatched", "report_unmatched"]
