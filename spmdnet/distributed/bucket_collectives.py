"""Bucket collectives: the started, later completed sums, reduce-scatters and
gathers of flat buffers that the parallel strategies overlap with compute.

A ``BucketComm`` runs them on one communicator in one of three modes, chosen
once from what every rank shares (buffer kind, MPI thread level):

- "nonblocking": MPI's non-blocking collectives (``Iallreduce``,
  ``Ireduce_scatter``, ``Iallgather``) on host buffers, started at once;
  ``progress`` tests them (MPICH progresses them only inside MPI calls).
- "thread": a communication thread runs the blocking call, in start order;
  a device (CuPy) buffer's stream is synchronised before the thread takes it
  (mpi4py does not), and it is staged through host memory when MPI is not
  CUDA-aware. Open MPI has no non-blocking reductions on device memory, so
  this is the overlap for GPU buffers; it needs MPI_THREAD_MULTIPLE.
- "none": the blocking call runs when the work is waited for.

Every work is started and waited for in the same order on every rank, and
its wait runs inside ``guarded`` (numbered, checked, watched), so the
collectives always match. (``all_gather_in_place`` and ``allgather_objects``
are the blocking calls the same wrappers make besides.) ``Work.wait``
returns the seconds it waited (the exposed communication). ``Work.then``
chains a second collective on the first one's result (HSDP's all-reduce
after its reduce-scatter): started once the first is done.
"""
import queue
import threading
import time

import numpy as np

from .. import backend
from ._mpi import mpi
from .collectives import on_host, to_host
from .guard import guarded

MODES = ("nonblocking", "thread", "none")


def choose_mode(overlap, on_gpu, thread_multiple):
    """The mode for ``overlap`` ("auto" or one of ``MODES``), validated:
    "auto" is "nonblocking" on host buffers, "thread" on device buffers when
    MPI grants MPI_THREAD_MULTIPLE, else "none"."""
    if overlap == "auto":
        if not on_gpu:
            return "nonblocking"
        return "thread" if thread_multiple else "none"
    if overlap not in MODES:
        raise ValueError(f"overlap must be 'auto' or one of {sorted(MODES)}, got {overlap!r}")
    if overlap == "thread" and not thread_multiple:
        raise ValueError("overlap='thread' needs MPI_THREAD_MULTIPLE, which this MPI "
                         "did not grant")
    if overlap == "nonblocking" and on_gpu:
        raise ValueError("overlap='nonblocking' is not safe on GPU buffers (Open MPI "
                         "has no non-blocking reductions on device memory)")
    return overlap


def all_gather_in_place(buf, comm, label="allgather(in place)"):
    """Blocking: rank r's equal block of ``buf`` (block r) reaches every
    rank's ``buf`` (ZeRO's parameters after the sharded step)."""
    with guarded(label, comm, buf):
        on_host(buf, lambda b: comm.Allgather(mpi().IN_PLACE, b))


def allgather_objects(obj, comm, label="allgather(objects)"):
    """Every rank's picklable ``obj``, in rank order (blocking; the small
    metadata a wrapper checks or reports: parameter names, shapes)."""
    with guarded(label, comm):
        return comm.allgather(obj)


class Work:
    """One started bucket collective (``label`` names it in errors and checks)."""

    def __init__(self, comm, label, buf, request=None, run=None, done=None, errors=None):
        self.comm, self.label, self.buf = comm, label, buf
        self.request, self.run, self.done, self.errors = request, run, done, errors

    def then(self, start_next):
        """This work followed by ``start_next()``'s (started when this one is done)."""
        return Chained(self, start_next)

    def test(self):
        """Whether it has completed (polls a non-blocking request)."""
        if self.request is not None:
            return self.request.Test()
        return self.done is not None and self.done.is_set()

    def wait(self):
        """Complete it inside ``guarded``; returns the seconds waited."""
        t0 = time.perf_counter()
        with guarded(self.label, self.comm, self.buf):
            if self.request is not None:
                self.request.Wait()
            elif self.done is not None:
                self.done.wait()
                if self.errors:
                    raise self.errors.pop(0)
            elif self.run is not None:
                self.run()
            self.run = self.request = None
        return time.perf_counter() - t0


class Chained:
    """A work, then the work ``start_next()`` starts once the first is done:
    when a ``test`` finds it done (so the second overlaps too), or in ``wait``.
    The first's ``guarded`` step (numbering, check) runs in ``wait``, the
    point every rank reaches in the same order; a ``test`` that finds it
    done (at a moment that differs between ranks) only completes it."""

    def __init__(self, first, start_next):
        self.first, self.start_next, self.second = first, start_next, None

    @property
    def request(self):  # the request in flight now (``BucketComm.progress`` tests it)
        return (self.first if self.second is None else self.second).request

    def test(self):
        if self.second is None:
            if not self.first.test():
                return False
            self.second = self.start_next()
        return self.second.test()

    def wait(self):
        waited = self.first.wait()
        if self.second is None:
            self.second = self.start_next()
        return waited + self.second.wait()

    then = Work.then


class BucketComm:
    """Bucket collectives over ``comm`` in ``mode`` (see the module docstring)."""

    def __init__(self, comm, mode="nonblocking"):
        if mode not in MODES:
            raise ValueError(f"BucketComm mode must be one of {MODES}, got {mode!r}")
        self.comm, self.mode = comm, mode
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        self._jobs = self._thread = None
        self._errors = []

    def _start(self, label, buf, nonblocking, blocking):
        if self.mode == "nonblocking" and not backend.is_cupy_array(buf):
            return Work(self.comm, label, buf, request=nonblocking())
        if self.mode == "thread":
            if backend.is_cupy_array(buf):
                backend.sync(buf)  # the kernels writing this buffer must be finished
            done = threading.Event()
            self._thread_jobs().put((blocking, done))
            return Work(self.comm, label, buf, done=done, errors=self._errors)
        return Work(self.comm, label, buf, run=blocking)

    def all_reduce(self, buf, label="allreduce(bucket)"):
        """Sum ``buf`` over the ranks, in place."""
        MPI = mpi()
        return self._start(
            label, buf, lambda: self.comm.Iallreduce(MPI.IN_PLACE, buf, MPI.SUM),
            lambda: on_host(buf, lambda b: self.comm.Allreduce(MPI.IN_PLACE, b, MPI.SUM)))

    def reduce_scatter(self, send, recv, counts, label="reduce_scatter(bucket)"):
        """Sum ``send`` over the ranks; rank r receives its ``counts[r]``
        elements (in rank order) into ``recv``."""
        MPI = mpi()

        def blocking():
            host = to_host(send)
            on_host(recv, lambda b: self.comm.Reduce_scatter(host, b, counts, MPI.SUM))
        return self._start(
            label, send, lambda: self.comm.Ireduce_scatter(send, recv, counts, MPI.SUM), blocking)

    def reduce_scatter_in_place(self, buf, counts=None, label="reduce_scatter(bucket)"):
        """Sum ``buf`` over the ranks; this rank's ``counts[rank]`` elements
        (in rank order; None: equal blocks, ``buf`` a multiple of the size
        long) land at the start of ``buf``, the rest of it is scratch."""
        MPI = mpi()
        n = buf.size // self.size if counts is None else counts[self.rank]

        def blocking():
            host, out = to_host(buf), np.empty(n, buf.dtype)
            if counts is None:
                self.comm.Reduce_scatter_block(host, out, MPI.SUM)
            else:
                self.comm.Reduce_scatter(host, out, counts, MPI.SUM)
            buf[:n] = backend.xp_of(buf).asarray(out)

        def nonblocking():
            if counts is None:
                return self.comm.Ireduce_scatter_block(MPI.IN_PLACE, buf, MPI.SUM)
            return self.comm.Ireduce_scatter(MPI.IN_PLACE, buf, counts, MPI.SUM)
        return self._start(label, buf, nonblocking, blocking)

    def all_gather(self, send, recv, label="allgather(bucket)"):
        """Every rank's ``send`` (equal sizes), in rank order, into ``recv``."""
        def blocking():
            host = to_host(send)
            on_host(recv, lambda b: self.comm.Allgather(host, b))
        return self._start(label, recv, lambda: self.comm.Iallgather(send, recv), blocking)

    @staticmethod
    def progress(works):
        """Test the non-blocking ``works`` in flight (MPICH progresses them
        only inside MPI calls)."""
        requests = [w.request for w in works if w is not None and w.request is not None]
        if requests:
            mpi().Request.Testall(requests)

    def _thread_jobs(self):
        if self._jobs is None:
            self._jobs = queue.Queue()
            self._thread = threading.Thread(target=self._serve, name="spmdnet-bucket-comm",
                                            daemon=True)
            self._thread.start()
        return self._jobs

    def _serve(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            run, done = job
            try:
                run()
            except BaseException as exc:  # handed to the main thread in Work.wait()
                self._errors.append(exc)
            done.set()

    def close(self):
        """Stop the communication thread (if one was started)."""
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = self._thread = None
