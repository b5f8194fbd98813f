"""Non-blocking MPI requests as the strategies complete them: polled for
progress, and waited for inside ``dist.guarded`` (numbered, checked, watched)."""
import time

from ... import distributed as dist


def progress(requests):
    """Test ``requests`` (MPI requests): MPICH progresses non-blocking
    collectives only inside MPI calls."""
    requests = list(requests)
    if requests:
        dist.mpi().Request.Testall(requests)


def guarded_wait(op, comm, req, buf=None):
    """Complete ``req`` inside ``dist.guarded``; returns the seconds waited."""
    t0 = time.perf_counter()
    with dist.guarded(op, comm, buf):
        req.Wait()
    return time.perf_counter() - t0
