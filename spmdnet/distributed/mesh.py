"""Mesh: the world split once into tensor-, data- and pipeline-parallel groups.

Ranks are laid out in Megatron's order tp-dp-pp (tp varies fastest)::

    rank = tp_rank + tp * (dp_rank + dp * pp_rank)

so the ranks of one tensor-parallel group are consecutive: with one node's
ranks numbered together by the launcher, a TP group (which communicates in
every layer) sits inside one node, and only data-parallel gradient
reductions (once per step) cross nodes. Every ``Comm.Split`` of spmdnet lives
in this file.
"""
from . import agreement, guard
from .checks import check_same
from .runtime import comm_or_default, init


def _check_sizes(tp, pp, size):
    """ValueError naming the numbers; the same verdict on every rank, because
    every rank checks the same values (``check_same`` ran before)."""
    for name, value in (("tp", tp), ("pp", pp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"Mesh: {name} must be a positive integer, got {value!r}")
    if size % (tp * pp):
        raise ValueError(f"Mesh: tp={tp} x pp={pp} = {tp * pp} does not divide the world "
                         f"size {size}; choose tp*pp among the divisors of {size}")


class Mesh:
    """A (pp, dp, tp) grid of ranks with one sub-communicator per axis.

    ``mesh.tp``, ``mesh.dp``, ``mesh.pp`` are mpi4py communicators holding
    the ranks that differ only in that coordinate; ``tp_rank``/``tp_size``
    (and dp, pp) are this rank's coordinate and the axis length.
    ``dp = size // (tp * pp)``. ``free()`` (or leaving a ``with`` block)
    releases the three communicators; the base communicator is the caller's.
    """

    def __init__(self, tp=1, pp=1, comm=None):
        if comm is None:
            init()
        self.comm = comm_or_default(comm)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        # Ranks that disagree on the layout would split into mismatched
        # groups and hang later: fail on every rank, here.
        check_same(self.comm, (repr(tp), repr(pp)), "Mesh (tp, pp)")
        _check_sizes(tp, pp, self.size)
        self.tp_size, self.pp_size = tp, pp
        self.dp_size = self.size // (tp * pp)
        self.tp_rank = self.rank % tp
        self.dp_rank = (self.rank // tp) % self.dp_size
        self.pp_rank = self.rank // (tp * self.dp_size)
        # colour = the coordinates a group shares; key = rank keeps the order
        self.tp = self.comm.Split(self.dp_rank + self.dp_size * self.pp_rank, self.rank)
        self.dp = self.comm.Split(self.tp_rank + tp * self.pp_rank, self.rank)
        self.pp = self.comm.Split(self.tp_rank + tp * self.dp_rank, self.rank)
        assert (self.tp.Get_rank(), self.dp.Get_rank(), self.pp.Get_rank()) == \
            (self.tp_rank, self.dp_rank, self.pp_rank), "Split order broke the layout"
        for group in (self.tp, self.dp, self.pp):
            guard.register(group)  # job-wide ids for the collective check mode

    def coords(self):
        """This rank's (pp_rank, dp_rank, tp_rank)."""
        return self.pp_rank, self.dp_rank, self.tp_rank

    def free(self):
        """Free the sub-communicators (idempotent; collective over the mesh)."""
        for name in ("tp", "dp", "pp"):
            comm = getattr(self, name)
            if comm is not None:
                guard.forget(comm)
                agreement.forget(comm)
                comm.Free()
                setattr(self, name, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __repr__(self):
        return (f"Mesh(size={self.size}, tp={self.tp_size}, dp={self.dp_size}, "
                f"pp={self.pp_size}, rank={self.rank}: tp_rank={self.tp_rank}, "
                f"dp_rank={self.dp_rank}, pp_rank={self.pp_rank})")
