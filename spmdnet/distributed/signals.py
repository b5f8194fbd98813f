"""Stop cleanly on a signal, at a step boundary all ranks agree on.

Slurm sends SIGTERM before killing a job (and ``--signal=USR1@90`` sends
SIGUSR1 90 s before the time limit). The handler only sets a flag; the
training loop asks ``should_stop()`` once per step, which reduces the flag
over the ranks (one tiny allreduce), so every rank stops after the same step
even though the signal reached them at different moments. Then every rank
calls ``finalize_and_exit(3)``: "stopped, resumable", the exit code that
Slurm requeueing scripts test for.
"""
import signal
import sys

import numpy as np

from ._mpi import mpi
from .guard import guarded
from .runtime import comm_or_default

STOPPED = 3  # the exit code of a job stopped by a signal, with a checkpoint to resume from


class StopSignal:
    """Catch ``signals`` (default SIGTERM, SIGUSR1) and agree on stopping."""

    def __init__(self, signals=(signal.SIGTERM, signal.SIGUSR1), comm=None):
        self.comm = comm_or_default(comm)
        self.received = None
        self._flag = np.zeros(1, dtype=np.int32)
        self._previous = {s: signal.signal(s, self._handle) for s in signals}

    def _handle(self, signum, frame):
        self.received = signal.Signals(signum).name

    def should_stop(self):
        """True on every rank when any rank has received a signal (collective)."""
        MPI = mpi()
        self._flag[0] = self.received is not None
        with guarded("allreduce(stop signal)", self.comm):
            self.comm.Allreduce(MPI.IN_PLACE, self._flag, op=MPI.MAX)
        return bool(self._flag[0])

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def finalize_and_exit(code=0):
    """End this process with exit status ``code``; every rank calls it with
    the same code (``sys.exit(main())`` of an SPMD program).

    A non-zero code finalizes MPI first: ``python -m mpi4py`` (the way to run
    under ``srun``) turns a non-zero ``SystemExit`` into ``MPI_Abort``, which
    kills the job with a message instead of exiting with the code. Code 0
    leaves MPI to finalize at exit as usual. Without MPI initialised it is
    ``sys.exit(code)``."""
    MPI = sys.modules.get("mpi4py.MPI")  # never initialise MPI just to finalize it
    if code and MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    sys.exit(code)
