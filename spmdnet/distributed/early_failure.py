"""A rank that fails before MPI has started ends the job under any launcher.

Under ``mpirun -n N python script.py``, a rank that raises before
``init_process_group`` (a bad argument, a missing file) exits without ever
calling ``MPI_Init``, and the other ranks wait in MPI start-up for ever:
MPICH's launcher waits for every rank to join. ``install`` (at ``import
spmdnet``, in a process the launcher started) adds an excepthook that, after
Python has printed the traceback, starts MPI in a helper thread and calls
``MPI_Abort``: the ranks waiting in start-up complete it with this one and
are ended with it. If no other rank starts MPI within ``EARLY_ABORT_S``
(a program that never uses MPI), the process just exits with its error.
After MPI has started, the abort hook of ``dist.init`` (``abort.py``) does
this job. Processes that such a rank starts (DataLoader workers) never
take this path: the hook belongs to the rank's own pid.
"""
import os
import sys
import threading

from .launcher_env import launched_rank_size

EARLY_ABORT_S = 30.0
_OWNER = "SPMDNET_EARLY_FAILURE_PID"  # the launched rank's pid, inherited by its children


def _start_mpi_and_abort():
    from mpi4py import MPI  # noqa: PLC0415 - starting MPI is the point, and only here
    MPI.COMM_WORLD.Abort(1)


def _hook(previous, rank):
    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        mpi = sys.modules.get("mpi4py.MPI")
        if issubclass(exc_type, KeyboardInterrupt) or (mpi is not None and mpi.Is_initialized()):
            return
        try:
            sys.stderr.write(f"[rank {rank}] spmdnet: this rank failed before MPI started; "
                             "ending the job (the other ranks would wait in MPI start-up)\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        thread = threading.Thread(target=_start_mpi_and_abort, daemon=True,
                                  name="spmdnet-early-abort")
        thread.start()
        thread.join(EARLY_ABORT_S)
    return hook


def install():
    """Add the hook in a launched rank of a job of several (idempotent; a
    no-op in a plain process and in processes a rank starts)."""
    rank, size = launched_rank_size()
    if rank is None or not size or size < 2:
        return False
    owner = os.environ.get(_OWNER)
    if owner is not None and owner != str(os.getpid()):
        return False  # a child of the rank (a loader worker): never start MPI
    if owner is None:
        os.environ[_OWNER] = str(os.getpid())
        sys.excepthook = _hook(sys.excepthook, rank)
    return True


__all__ = ["install", "EARLY_ABORT_S"]
