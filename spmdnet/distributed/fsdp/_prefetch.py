"""Prefetching all-gathers of FullyShardedDataParallel's parameters
(``Prefetcher``; the gradients' reduce-scatters are the wrapper's
``ParamAndGradBuffer``'s).

A step gathers the flat shards in an order that repeats from step to step
(forward: the units in execution order; backward: their recomputations in
reverse). The ``Prefetcher`` records each phase's order; in the next step,
while the gathers follow the recorded order, gathering flat k starts the
non-blocking all-gather (``Iallgather``) of flat k+1, so it travels while
unit k computes (mode "pre": ``forward_prefetch=True`` in forward,
``BackwardPrefetch.BACKWARD_PRE`` in backward). Mode "post"
(``BACKWARD_POST``) starts it only once unit k's backward is done and its
full parameters are freed (``released``): less overlap, one unit's full
parameters fewer at the peak. A phase without a mode gathers when a unit
needs its parameters (blocking). Every started request is completed: by the gather that
uses it, or when the phase ends (a wrong guess costs one unused gather and
keeps the collectives matched, since every rank guesses alike). Shards do
not change inside a phase, so a prefetched copy is never stale.

MPICH progresses non-blocking collectives only inside MPI calls: every
gather and ``poke()`` tests the requests in flight. Device (CuPy) shards use
blocking gathers (the host staging of ``dist.allgather``).

The gathers run through a ``distributed.bucket_collectives.BucketComm``
(as the gradient buckets), completed inside ``guarded`` in start order on
every rank, so the sequence numbers, the check mode and the watchdog see
every one. ``wait_s`` sums the seconds spent waiting (the exposed
communication: the wait of non-blocking gathers, and the whole of blocking
ones).
"""
from ..bucket_collectives import BucketComm
from ._flat_param import wire


class Prefetcher:
    def __init__(self, comm, forward, backward):
        """``forward``: prefetch in forward (bool); ``backward``: "pre", "post"
        or None (PyTorch's ``BackwardPrefetch``)."""
        self.bc = BucketComm(comm, "nonblocking")
        many = comm.Get_size() > 1  # one rank: a gather is a copy
        self.modes = {"forward": "pre" if forward and many else None,
                      "backward": backward if many else None}
        self.last = {}  # phase -> [flat] gathered in that phase last time
        self.phase, self.seen, self.pending = None, [], {}
        self.hits, self.wait_s = 0, 0.0

    def begin(self, phase):
        """Start a phase; its first flat's gather starts at once (known from last time)."""
        self.end()
        self.phase = phase
        order = self.last.get(phase, ())
        if self.modes[phase] and order and order[0].prefetchable:
            self._start(order[0])

    def end(self):
        """Complete every request in flight; remember this phase's order."""
        for flat in list(self.pending):
            flat.give(self._wait(flat))  # a wrong guess: the buffer goes back to the pool
        if self.phase is not None:
            self.last[self.phase] = self.seen
        self.phase, self.seen = None, []

    def fetch(self, flat):
        """The full (padded) flat array of ``flat``: prefetched or gathered now."""
        full = self._wait(flat) if flat in self.pending else None
        if full is None:
            full, waited = flat.gather_params()
            self.wait_s += waited
        else:
            self.hits += 1
        if self.phase is None:
            return full
        self.seen.append(flat)
        if self.modes[self.phase] == "pre":
            self._ahead()
        return full

    def released(self):
        """A unit's backward is done and its parameters freed: in mode "post"
        the next recorded gather starts."""
        if self.phase is not None and self.modes[self.phase] == "post":
            self._ahead()

    def _ahead(self):
        """Start the gather that follows the last one seen, while this phase
        follows its recorded order."""
        order, i = self.last.get(self.phase, ()), len(self.seen)
        if (0 < i < len(order) and order[i - 1] is self.seen[-1]
                and order[i] not in self.pending and order[i].prefetchable):
            self._start(order[i])

    def poke(self):
        self.bc.progress(work for work, _ in self.pending.values())

    def _start(self, flat):
        buf = flat.take()
        work = self.bc.all_gather(flat.send(), wire(buf), "allgather(FSDP prefetch)")
        self.pending[flat] = (work, buf)
        self.poke()  # a first progress call: the transfer starts before the next compute

    def _wait(self, flat):
        work, buf = self.pending.pop(flat)
        self.wait_s += work.wait()
        return buf
