"""Stop cleanly on a signal, at a step boundary all ranks agree on.

Slurm sends SIGTERM before killing a job (and ``--signal=USR1@90`` sends
SIGUSR1 90 s before the time limit). The handler only sets a flag; the
training loop asks ``should_stop()`` once per step, which reduces the flag
over the ranks (one tiny allreduce), so every rank stops after the same step
even though the signal reached them at different moments.
"""
import signal

import numpy as np

from .world import comm_or_default


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
        from mpi4py import MPI  # noqa: PLC0415
        from .guard import guarded  # noqa: PLC0415
        self._flag[0] = self.received is not None
        with guarded("allreduce(stop signal)", self.comm):
            self.comm.Allreduce(MPI.IN_PLACE, self._flag, op=MPI.MAX)
        return bool(self._flag[0])

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
