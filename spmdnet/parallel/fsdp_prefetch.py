"""Prefetching all-gathers for FullyShardedDataParallel.

A step gathers the flat shards in an order that repeats from step to step
(forward: the units in execution order; backward: their recomputations in
reverse). The ``Prefetcher`` records each phase's order; in the next step,
while the gathers follow the recorded order, gathering flat k starts the
non-blocking all-gather (``Iallgather``) of flat k+1, so it travels while
unit k computes. Every started request is completed: by the gather that
uses it, or when the phase ends (a wrong guess costs one unused gather and
keeps the collectives matched, since every rank guesses alike). Shards do
not change inside a phase, so a prefetched copy is never stale.

MPICH progresses non-blocking collectives only inside MPI calls: every
gather and ``poke()`` tests the requests in flight. Device (CuPy) shards use
blocking gathers (the host staging of ``dist.allgather``).
"""
from .. import distributed as dist
from ..backend import is_cupy_array


class Prefetcher:
    def __init__(self, comm, enabled):
        self.comm, self.enabled = comm, enabled and comm.Get_size() > 1
        self.last = {}  # phase -> [flat] gathered in that phase last time
        self.phase, self.seen, self.pending = None, [], {}
        self.hits = 0

    def begin(self, phase):
        self.end()
        self.phase = phase

    def end(self):
        """Complete every request in flight; remember this phase's order."""
        for flat in list(self.pending):
            self._wait(flat)
        if self.phase is not None:
            self.last[self.phase] = self.seen
        self.phase, self.seen = None, []

    def fetch(self, flat):
        """The full (padded) flat array of ``flat``: prefetched or gathered now."""
        full = self._wait(flat) if flat in self.pending else None
        if full is None:
            full = flat.allgather()
        else:
            self.hits += 1
        if self.phase is None:
            return full
        self.seen.append(flat)
        order, i = self.last.get(self.phase, ()), len(self.seen)
        if (self.enabled and i < len(order) and order[i - 1] is flat
                and order[i] not in self.pending and not is_cupy_array(order[i].shard.data)):
            self._start(order[i])
        return full

    def poke(self):
        if self.pending:
            dist.mpi().Request.Testall([req for req, _ in self.pending.values()])

    def _start(self, flat):
        buf = flat.xp.empty(flat.shard_numel * flat.size, flat.dtype)
        req = self.comm.Iallgather(flat.shard.data, buf)
        self.pending[flat] = (req, buf)

    def _wait(self, flat):
        req, buf = self.pending.pop(flat)
        with dist.guarded("allgather(FSDP prefetch)", self.comm, buf):
            req.Wait()
        return buf
