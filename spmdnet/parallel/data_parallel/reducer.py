"""Start and finish the allreduce of gradient buckets.

Three ways to overlap communication with backward, chosen once per
DataParallel from values every rank shares (buffer kind, MPI thread level):
- "nonblocking": ``Iallreduce`` on host buffers, started as soon as a bucket
  is full; MPI progresses it while NumPy computes earlier layers.
- "thread": a communication thread runs blocking ``Allreduce`` calls in
  bucket order (GPU buffers: Open MPI has no non-blocking reductions on device
  memory); needs MPI_THREAD_MULTIPLE.
- "none": every bucket is reduced, blocking, after backward.
Buckets are started in index order and completed in index order on every
rank, so the collectives always match. The reducers call the communicator
unguarded (one of them from its own thread); ``DataParallel`` wraps each
bucket's ``wait`` in ``dist.guarded``.
"""
import queue
import threading

from ... import distributed as dist
from ...backend import is_cupy_array, sync
from .._common.requests import progress


def _sum_in_place(buffer, comm):
    """Blocking in-place sum of a bucket buffer (NumPy or CuPy) over ``comm``."""
    MPI = dist.mpi()
    dist.on_host(buffer, lambda buf: comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM))


class NonBlockingReducer:
    def __init__(self, comm):
        self.comm, self.MPI, self.requests = comm, dist.mpi(), {}

    def start(self, bucket):
        self.requests[bucket.index] = self.comm.Iallreduce(self.MPI.IN_PLACE, bucket.buffer,
                                                           self.MPI.SUM)

    def poke(self):
        """Give MPI a chance to progress in-flight reductions."""
        progress(self.requests.values())

    def wait(self, bucket):
        self.requests.pop(bucket.index).Wait()

    def close(self):
        pass


class ThreadReducer:
    def __init__(self, comm):
        self.comm = comm
        self.jobs, self.done, self.errors = queue.Queue(), {}, []
        self.thread = threading.Thread(target=self._run, name="spmdnet-allreduce", daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            job = self.jobs.get()
            if job is None:
                return
            bucket, done = job
            try:
                _sum_in_place(bucket.buffer, self.comm)
            except BaseException as exc:  # handed to the main thread in wait()
                self.errors.append(exc)
            done.set()

    def start(self, bucket):
        if is_cupy_array(bucket.buffer):
            sync(bucket.buffer)  # the kernels writing this bucket must be finished
        done = self.done[bucket.index] = threading.Event()
        self.jobs.put((bucket, done))

    def poke(self):
        pass

    def wait(self, bucket):
        self.done.pop(bucket.index).wait()
        if self.errors:
            raise self.errors.pop(0)

    def close(self):
        self.jobs.put(None)


class BlockingReducer:
    def __init__(self, comm):
        self.comm = comm

    def start(self, bucket):
        pass

    def poke(self):
        pass

    def wait(self, bucket):
        _sum_in_place(bucket.buffer, self.comm)

    def close(self):
        pass


REDUCERS = {"nonblocking": NonBlockingReducer, "thread": ThreadReducer,
            "none": BlockingReducer}


def choose_overlap(overlap, on_gpu, thread_multiple):
    """The overlap mode for "auto", or validate an explicit one."""
    if overlap == "auto":
        if not on_gpu:
            return "nonblocking"
        return "thread" if thread_multiple else "none"
    if overlap not in REDUCERS:
        raise ValueError(f"overlap must be 'auto' or one of {sorted(REDUCERS)}, got {overlap!r}")
    if overlap == "thread" and not thread_multiple:
        raise ValueError("overlap='thread' needs MPI_THREAD_MULTIPLE, which this MPI "
                         "did not grant")
    return overlap
