"""DTensor's placements: ``Shard(dim)``, ``Replicate()``, ``Partial(reduce_op)``."""


class Placement:
    """How a tensor lies along one mesh dimension."""

    def is_shard(self, dim=None):
        return isinstance(self, Shard) and (dim is None or self.dim == dim)

    def is_replicate(self):
        return isinstance(self, Replicate)

    def is_partial(self, reduce_op=None):
        return isinstance(self, Partial) and (reduce_op is None or self.reduce_op == reduce_op)


class Shard(Placement):
    """Split along ``dim`` in ``torch.chunk``'s pieces: ceil(n / size) rows
    per rank, so the last ranks may hold fewer (or none)."""

    def __init__(self, dim):
        self.dim = dim

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self):
        return hash(("Shard", self.dim))

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class Replicate(Placement):
    """The whole tensor on every rank."""

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash("Replicate")

    def __repr__(self):
        return "Replicate()"


class Partial(Placement):
    """Every rank holds a partial value; the tensor is their reduction."""

    def __init__(self, reduce_op="sum"):
        if reduce_op not in ("sum", "avg", "max", "min"):
            raise ValueError(f"Partial(reduce_op={reduce_op!r}): use 'sum', 'avg', "
                             "'max' or 'min'")
        self.reduce_op = reduce_op

    def __eq__(self, other):
        return isinstance(other, Partial) and other.reduce_op == self.reduce_op

    def __hash__(self):
        return hash(("Partial", self.reduce_op))

    def __repr__(self):
        return f"Partial({self.reduce_op})"


def chunk_bounds(length, size, index):
    """Rows [start, stop) of piece ``index`` when ``length`` rows are split
    into ``size`` pieces as ``torch.chunk`` splits them."""
    step = -(-length // size) if length else 0
    start = min(index * step, length)
    return start, min(start + step, length)
