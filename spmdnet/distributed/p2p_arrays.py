"""Blocking point-to-point transfer of one array between two ranks of a
communicator, its shape and dtype sent ahead (the pipeline's activations and
their gradients): the receiver needs no size agreed beforehand. Both ends wait
under ``guarded`` (the stall watchdog, check mode's cross-rank report) and
``guard.wait_p2p`` (check mode names a transfer whose peer waits elsewhere)."""
import numpy as np

from ..backend import asnumpy
from . import guard
from .guard import guarded


def send_array(comm, array, dest, tag):
    host = np.ascontiguousarray(asnumpy(array))
    op = f"send(tag {tag})"
    with guarded(op, comm, host, peer=dest):
        comm.send((host.shape, host.dtype.str), dest=dest, tag=tag)
        request = comm.Isend(host, dest=dest, tag=tag)
        # check mode: a send the peer never receives is a wait, reported like a collective's
        guard.wait_p2p(comm, dest, op, "send", tag, request.Test)
        request.Wait()


def recv_array(comm, source, tag):
    op = f"recv(tag {tag})"
    with guarded(op, comm, peer=source):
        guard.wait_p2p(comm, source, op, "recv", tag,
                       lambda: comm.Iprobe(source=source, tag=tag))
        shape, dtype = comm.recv(source=source, tag=tag)
        out = np.empty(shape, dtype=np.dtype(dtype))
        comm.Recv(out, source=source, tag=tag)
    return out
