"""Cross-rank agreement checks, raised collectively: every rank gathers every
rank's value and raises the same DistributedError, so no rank is left waiting
in a collective that the others will never join."""
from ..errors import DistributedError
from .guard import guarded


def first_difference(values):
    """(rank, value) of the first rank whose value differs from rank 0's, or None."""
    for r, v in enumerate(values):
        if v != values[0]:
            return r, v
    return None


def check_same(comm, value, what):
    """Raise DistributedError on every rank unless all ranks pass equal ``value``.

    ``value`` must be picklable and small (shapes, names, lengths)."""
    with guarded(f"check_same({what})", comm):
        values = comm.allgather(value)
    diff = first_difference(values)
    if diff is not None:
        r, v = diff
        raise DistributedError(f"{what} differs across ranks: rank 0 has {values[0]!r}, "
                               f"rank {r} has {v!r}")
    return values[0]
