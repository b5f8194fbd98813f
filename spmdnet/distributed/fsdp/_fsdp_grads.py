"""``fully_shard``'s gradient communication, all of it: a unit's full
gradients become its shards' ``.grad``.

Each full gradient (cast to the reduce dtype) is reduce-scattered along its
sharded dimension over the shard group, as the mean over that group; on a
2-D (replicate, shard) mesh (HSDP) the piece is then all-reduced, as the
mean, over the replicate group, so every shard's gradient is the mean over
all ranks. The piece is cast back to the shard's dtype, moved to where the
shard lives (the host under ``CPUOffloadPolicy``) and added into the
shard's ``.grad`` (accumulating, as ``.grad`` does); the full gradient is
dropped.
"""
from ...backend import device_of
from ..._tensor import Tensor
from .. import collectives
from ..tensor._api import reduce_scatter_dim
from ._fsdp_storage import on_device


class GradReducer:
    """Reduces the full gradients of one unit's entries into their shards."""

    def __init__(self, shard_comm, replicate_comm, reduce_dtype):
        self.shard_comm = shard_comm
        self.replicate_comm = None  # HSDP's replicate group, when it has other ranks
        if replicate_comm is not None and replicate_comm.Get_size() > 1:
            self.replicate_comm = replicate_comm
        self.reduce_dtype = reduce_dtype

    def reduce(self, entries):
        """Reduce every entry's full gradient that backward produced (in order:
        the same collectives on every rank)."""
        for e in entries:
            if e.full is None or e.full.grad is None:
                continue
            grad = e.full.grad.array
            if self.reduce_dtype is not None:
                grad = grad.astype(self.reduce_dtype, copy=False)
            piece = reduce_scatter_dim(grad, e.dim, self.shard_comm)
            if self.replicate_comm is not None:
                piece = collectives.allreduce(piece, "mean", self.replicate_comm)
            piece = on_device(piece, device_of(e.shard.array))
            piece = piece.astype(e.shard.array.dtype, copy=False)
            if e.shard.grad is None:
                e.shard.grad = Tensor(piece)
            else:
                e.shard.grad.array += piece
            e.full.grad = None
