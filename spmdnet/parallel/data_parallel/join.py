"""Uneven inputs: PyTorch's ``join()`` for DataParallel.

When ranks have different numbers of batches, the first rank to run out
would leave the others waiting in their next gradient allreduce. Inside
``with ddp.join():`` every training iteration starts (in ``ddp``'s forward)
with a one-integer allreduce of "still training" flags on DataParallel's
communicator; a rank that has run out of data leaves the ``with`` block and
*shadows* the others: per iteration it answers that allreduce with 0 and then
runs the collectives of every registered joinable, with zeros. The gradient
mean stays divided by the initial number of ranks (PyTorch's default
``divide_by_initial_world_size``): a rank that has joined contributes zeros.
When no rank trains any more, every rank takes the parameters and buffers of
the last rank to run out (ties: the highest rank), so all finish equal.

A joinable is an object with two methods:
- ``join_shadow()``: the collectives one training iteration makes, run by a
  rank that has run out of data (zeros in, results ignored);
- ``join_done(last_rank)``: called once on every rank after the loop.
DataParallel is one (its gradient buckets and the non-finite check). Modules
inside the wrapped model that have both methods (a SyncBatchNorm, say) are
registered automatically; their shadows run before DataParallel's, the order
of a real iteration (forward reductions, then the buckets), and they must
communicate on a communicator of their own (not DataParallel's private one).
"""
from ... import distributed as dist


def notify(comm, training):
    """Number of ranks of ``comm`` still training (collective)."""
    return dist.allreduce(int(training), op="sum", comm=comm)


class Join:
    """``with ddp.join(joinables=()):`` (see the module docstring)."""

    def __init__(self, ddp, joinables=()):
        self.ddp = ddp
        found = [m for m in ddp.module.modules() if _is_joinable(m)]
        self.joinables = [*found, *joinables, ddp]

    def __enter__(self):
        self.ddp._join_iterations = 0
        self.ddp._joining = True
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is not None:
                return False  # an error: no shadowing (the abort hook ends the job)
            while notify(self.ddp.comm, False):
                for joinable in self.joinables:
                    joinable.join_shadow()
            last = last_rank(self.ddp.comm, self.ddp._join_iterations)
            for joinable in self.joinables:
                joinable.join_done(last)
        finally:
            self.ddp._joining = False
        return False


def last_rank(comm, iterations):
    """The rank with the most iterations (the highest such rank)."""
    size = comm.Get_size()
    return dist.allreduce(iterations * size + comm.Get_rank(), op="max", comm=comm) % size


def _is_joinable(module):
    return callable(getattr(module, "join_shadow", None)) and \
        callable(getattr(module, "join_done", None))
