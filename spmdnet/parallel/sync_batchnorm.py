"""SyncBatchNorm's communication: the layer is PyTorch's
``nn.SyncBatchNorm`` (``spmdnet/nn/modules/batchnorm.py``, PyTorch's path);
this module registers with it how a group reduces (``_Group``), and checks
a wrapped model's layers at DataParallel's wrap time (``attach``).

The group is any communicator (the world by default, ``mesh.dp``, a split
of it); each layer reduces on a private duplicate of it. Forward: one
allgather of every rank's per-channel (count, mean, M2), combined by Chan's
formula (numerically safe, and ranks may hold different numbers of
samples, even none); the running variance takes the group's unbiased
variance. Backward: one allreduce of the two per-channel sums (of dy and of
dy·x̂), divided by the group's count. Weight and bias gradients stay local
sums: DataParallel averages them. So N ranks with equal local batches (each
loss a mean over its batch) equal one process with BatchNorm on the global
batch; with unequal local batches the statistics are still the global
batch's, while DataParallel's mean of per-rank mean losses weighs a sample
of rank r by 1/(N·b_r).

Under ``DataParallel.join()`` a rank that ran out of data answers each
layer's collectives with zeros, in a real iteration's order: the forwards
in module order, then the backwards in reverse (``attach`` links the
layers of a wrapped model; it assumes they run in registration order).
"""
import numpy as np

from .. import distributed as dist
from ..backend import asnumpy, xp_of
from ..errors import DistributedError
from ..nn.modules.batchnorm import SyncBatchNorm, register_sync_backend


class _Group:
    """The two reductions of one layer, on its private communicator, in float64."""

    def __init__(self, comm):
        self.comm = comm

    def allgather(self, row):
        # every rank's row holds 1 + 2C float64 values: equal by construction
        return dist.allgather(row, comm=self.comm, same_shape=True)

    def allreduce_host(self, sums):
        return dist.allreduce(sums, op="sum", comm=self.comm)  # in place: sums is a fresh copy

    def combine(self, count, mean, m2):
        """The group's (count, mean, M2) from every rank's."""
        xp, c = xp_of(mean), mean.shape[0]
        row = np.concatenate([[float(count)], asnumpy(mean).astype(np.float64),
                              asnumpy(m2).astype(np.float64)])
        every = self.allgather(row)
        counts, means, m2s = every[:, :1], every[:, 1:c + 1], every[:, c + 1:]
        total = counts.sum()
        if total == 0:
            return 0, xp.zeros_like(mean), xp.zeros_like(m2)
        gmean = (counts * means).sum(axis=0) / total
        gm2 = (m2s + counts * (means - gmean) ** 2).sum(axis=0)
        return int(total), xp.asarray(gmean), xp.asarray(gm2)

    def allreduce(self, sums):
        out = self.allreduce_host(asnumpy(sums).astype(np.float64))
        return xp_of(sums).asarray(out.astype(sums.dtype))


register_sync_backend(resolve=dist.comm_or_default, size=lambda comm: comm.Get_size(),
                      reducer=lambda comm: _Group(dist.dup(comm)))


def _contained(inner, outer):
    """Whether every rank of communicator ``inner`` is in ``outer`` (local)."""
    group, big = inner.Get_group(), outer.Get_group()
    try:
        where = group.Translate_ranks(list(range(group.Get_size())), big)
    finally:
        group.Free()
        big.Free()
    return all(r != dist.mpi().UNDEFINED for r in where)


def attach(model, comm, before_shadow):
    """At DataParallel's wrap time: raise DistributedError on every rank of
    ``comm`` when a SyncBatchNorm's group is not contained in ``comm``; link
    the layers for ``join`` (forwards in module order, then the backwards
    in reverse, after ``before_shadow()``: DataParallel's buffer broadcast)."""
    layers = [m for m in model.modules() if isinstance(m, SyncBatchNorm)]
    bad = [i for i, m in enumerate(layers) if not _contained(m.group_comm(), comm)]
    if dist.allreduce(int(bool(bad)), op="max", comm=comm):
        names = {id(m): n for n, m in model.named_modules()}
        which = ", ".join(repr(names[id(layers[i])]) for i in bad) or "(on another rank)"
        raise DistributedError(
            f"DataParallel: SyncBatchNorm {which} synchronises over a group that is not "
            f"contained in DataParallel's communicator (rank {dist.rank_label()}); pass "
            f"the data-parallel group, e.g. SyncBatchNorm(..., comm=mesh.dp) or "
            f"convert_sync_batchnorm(model, comm=mesh.dp)")
    for m in layers:
        m._join_chain, m._join_hook = layers, None
    if layers:
        layers[0]._join_hook = before_shadow
