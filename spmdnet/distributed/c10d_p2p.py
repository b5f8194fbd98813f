"""torch.distributed's point-to-point calls and work objects on MPI.

``send``/``recv`` block; ``isend``/``irecv`` start MPI's non-blocking
``Isend``/``Irecv`` and return a ``Work`` whose ``wait()`` completes it
(a received device or non-contiguous tensor is filled at ``wait()``).
``dst``/``src`` are global ranks whatever the group, as PyTorch's.
Collectives called with ``async_op=True`` complete before they return and
give a ``Work`` that is already completed (PyTorch allows that: ``wait()``
is then a no-op).
"""
import datetime
import time

import numpy as np

from .. import backend
from ..errors import DistributedError
from .c10d import as_group, member
from .collectives import to_host, tensor_array
from . import sends
from .guard import guarded
from ._mpi import mpi
from .runtime import rank_label


class Work:
    """PyTorch's work handle: ``wait()``, ``is_completed()``, ``is_success()``,
    ``exception()``, ``result()``."""

    def __init__(self, tensors=(), request=None, finish=None, label="", comm=None, peer=None):
        self._tensors, self._request, self._finish = list(tensors), request, finish
        self._label, self._comm, self._peer = label, comm, peer
        self._done = request is None

    def is_completed(self):
        if not self._done and self._request.Test():
            self._complete()
        return self._done

    def wait(self, timeout=None):
        """Block until the operation has finished; returns True. With
        ``timeout`` (a timedelta or seconds), a RuntimeError
        (DistributedError) after that long, as PyTorch's; the operation
        stays pending (``wait()`` again, or ``is_completed()``)."""
        if not self._done:
            seconds = _seconds(timeout)
            with guarded(self._label, self._comm, peer=self._peer):
                if seconds is None:
                    self._request.Wait()
                else:
                    self._wait_until(time.monotonic() + seconds, seconds)
            self._complete()
        return True

    def _wait_until(self, deadline, seconds):
        pause = 1e-5
        while not self._request.Test():
            if time.monotonic() >= deadline:
                kind = "recv" if self._label.startswith("irecv") else "send"
                raise DistributedError(
                    f"Timed out waiting {seconds * 1000:.0f}ms for {kind} operation to "
                    f"complete: {self._label} on rank {rank_label()} (the peer has not "
                    f"{'sent' if kind == 'recv' else 'received'} it)")
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)

    def _complete(self):
        self._done = True
        if self._finish is not None:
            self._finish()
            self._finish = None

    def is_success(self):
        return self.is_completed()

    def exception(self):
        return None

    def result(self):
        return list(self._tensors)

    def __repr__(self):
        return f"Work({self._label or 'collective'}, completed={self._done})"


def _seconds(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout >= 0:
        return float(timeout)
    raise TypeError(f"Work.wait: timeout must be a datetime.timedelta or seconds >= 0, "
                    f"got {timeout!r}")


def completed(*tensors):
    """The work of a collective that has already finished."""
    return Work(tensors)


def _peer(group, rank, op, name):
    """(group, the peer's rank in it) for a global ``rank``; None outside the group."""
    pg = member(group, op)
    if pg is None:
        return None, None
    if rank is None:
        return pg, None
    peer = pg.group_rank(rank, name)
    if peer == pg.rank():
        raise ValueError(f"{op}: {name} {rank} is this process's own rank; "
                         "a process cannot send to or receive from itself")
    return pg, peer


def _resolve(rank, group_rank, group, name):
    """PyTorch's ``dst``/``group_dst`` pair: a global rank, or one given in the group."""
    if group_rank is None:
        return rank
    if rank is not None:
        raise ValueError(f"give either {name} or group_{name}, not both")
    return as_group(group).ranks[group_rank]


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Send ``tensor`` to global rank ``dst`` (blocking)."""
    dst = _resolve(dst, group_dst, group, "dst")
    pg, peer = _peer(group, dst, "send", "dst")
    if pg is None:
        return None
    arr = tensor_array(tensor, "send")
    if arr.nbytes <= sends.SMALL_BYTES:  # see ``sends``: never lost silently
        buf = np.array(to_host(arr), copy=True, order="C")
        request = pg.comm.Issend(buf, dest=peer, tag=tag)
        sends.track(request, buf, f"dist.send to rank {dst} (tag {tag}, {arr.size} "
                                  f"{arr.dtype} values, shape {tuple(arr.shape)})")
        return None
    with guarded("send", pg.comm, arr, peer=dst):
        pg.comm.Send(to_host(arr), dest=peer, tag=tag)
    return None


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receive into ``tensor`` from global rank ``src`` (None: any rank);
    returns the sender's global rank."""
    src = _resolve(src, group_src, group, "src")
    pg, peer = _peer(group, src, "recv", "src")
    if pg is None:
        return -1
    arr = tensor_array(tensor, "recv")
    status = mpi().Status()
    source = mpi().ANY_SOURCE if peer is None else peer
    buf, finish = _receive_buffer(arr)
    with guarded("recv", pg.comm, arr, peer="any" if src is None else src):
        pg.comm.Recv(buf, source=source, tag=tag, status=status)
    finish()
    return pg.ranks[status.Get_source()]


def _receive_buffer(arr):
    """(a buffer MPI may write, the function that puts it into ``arr``)."""
    if not backend.is_cupy_array(arr) and arr.flags.c_contiguous and arr.flags.writeable:
        return arr, lambda: None
    host = np.empty(arr.shape, arr.dtype)
    if backend.is_cupy_array(arr):
        backend.sync(arr)
        return host, lambda: arr.__setitem__(Ellipsis, backend.xp_of(arr).asarray(host))
    return host, lambda: arr.__setitem__(Ellipsis, host)


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Start sending ``tensor`` to global rank ``dst``; returns a Work (None
    outside the group). Do not modify ``tensor`` before ``wait()``."""
    dst = _resolve(dst, group_dst, group, "dst")
    pg, peer = _peer(group, dst, "isend", "dst")
    if pg is None:
        return None
    arr = tensor_array(tensor, "isend")
    buf = to_host(arr)
    request = pg.comm.Isend(buf, dest=peer, tag=tag)
    # ``buf`` stays referenced by the Work until the send completes.
    return Work([tensor], request, finish=lambda: buf, label=f"isend to rank {dst}",
                comm=pg.comm, peer=dst)


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    """Start receiving into ``tensor`` from global rank ``src`` (None: any);
    returns a Work; ``tensor`` holds the data after ``wait()``."""
    src = _resolve(src, group_src, group, "src")
    pg, peer = _peer(group, src, "irecv", "src")
    if pg is None:
        return None
    arr = tensor_array(tensor, "irecv")
    buf, finish = _receive_buffer(arr)
    source = mpi().ANY_SOURCE if peer is None else peer
    request = pg.comm.Irecv(buf, source=source, tag=tag)
    return Work([tensor], request, finish=finish, label=f"irecv from rank {src}",
                comm=pg.comm, peer="any" if src is None else src)


class P2POp:
    """One ``isend``/``irecv`` for ``batch_isend_irecv`` (PyTorch's)."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        if op not in (isend, irecv):
            raise ValueError("P2POp's op must be dist.isend or dist.irecv, "
                             f"got {getattr(op, '__name__', op)!r}")
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag
        self.group_peer = group_peer


def batch_isend_irecv(p2p_op_list):
    """Start every P2POp; returns their Works (wait on each)."""
    if not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise TypeError("batch_isend_irecv expects a list of dist.P2POp")
    return [p.op(p.tensor, p.peer, p.group, p.tag, p.group_peer) for p in p2p_op_list]


__all__ = ["Work", "send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv"]
