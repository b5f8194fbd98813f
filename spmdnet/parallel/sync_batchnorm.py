"""SyncBatchNorm: batch normalization whose training statistics are those of
the whole group's batch (PyTorch's ``nn.SyncBatchNorm``, ChainerMN's
multi-node batch normalization).

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
from ..nn.modules.batchnorm import _BatchNorm
from ..ops.batchnorm import batch_norm


class _Group:
    """The two reductions of one layer, on its private communicator, in float64."""

    def __init__(self, comm):
        self.comm = comm

    def allgather(self, row):
        out = np.empty((self.comm.Get_size(), row.size), np.float64)
        with dist.guarded("allgather(SyncBatchNorm statistics)", self.comm, row):
            self.comm.Allgather(row, out)
        return out

    def allreduce_host(self, sums):
        out = np.empty_like(sums)
        with dist.guarded("allreduce(SyncBatchNorm gradient sums)", self.comm, sums):
            self.comm.Allreduce(sums, out, op=dist.mpi().SUM)
        return out

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


class SyncBatchNorm(_BatchNorm):
    """``nn.SyncBatchNorm(num_features, eps, momentum, affine,
    track_running_stats, comm=None)``; ``process_group=`` is PyTorch's name
    for ``comm``; None is the world. Input (N, C, *). Eval mode (or a group
    of one rank) is plain batch normalization."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, comm=None, process_group=None, device=None,
                 dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device, dtype)
        if comm is not None and process_group is not None and comm is not process_group:
            raise ValueError("SyncBatchNorm: give comm or process_group, not both")
        self.process_group = comm if comm is not None else process_group
        self._group = None
        self._join_chain, self._join_hook = None, None

    def _check_input_dim(self, x):
        if x.ndim < 2:
            raise ValueError(f"SyncBatchNorm: expected at least 2D input (N, C, *), got "
                             f"{x.ndim}D input of shape {tuple(x.shape)}")

    def group_comm(self):
        """The communicator the statistics are synchronised over."""
        return dist.comm_or_default(self.process_group)

    def _synced(self):
        """Whether this forward reduces (the same answer on every rank of the group)."""
        return self._uses_batch_stats() and self.training and self.group_comm().Get_size() > 1

    def _reducer(self):
        if self._group is None:  # collective over the group: first synchronised forward
            self._group = _Group(dist.dup(self.group_comm()))
        return self._group

    def forward(self, x):
        self._check_input_dim(x)
        if not self._synced():
            return super().forward(x)
        factor = self._factor()
        return batch_norm(x, *self._running(), self.weight, self.bias, True, factor,
                          self.eps, group=self._reducer())

    # -- the joinable protocol (data_parallel/join.py) ----------------------------------
    def join_shadow(self):
        """A rank out of data answers one iteration's reductions with zeros."""
        chain = self._join_chain or [self]
        if self is chain[0] and self._join_hook is not None:
            self._join_hook()  # DataParallel's buffer broadcast comes before any forward
        c = self.num_features
        if self._synced():
            self._reducer().allgather(np.zeros(1 + 2 * c))
        if self is chain[-1]:
            for layer in reversed(chain):
                if layer._synced():
                    layer._reducer().allreduce_host(np.zeros((2, layer.num_features)))

    def join_done(self, last_rank):
        """Nothing to do: DataParallel hands every rank the last rank's buffers."""

    @classmethod
    def convert_sync_batchnorm(cls, module, comm=None, process_group=None):
        """``module`` with every BatchNorm*d replaced by a SyncBatchNorm over
        ``comm`` (same parameters, buffers, mode); returns the new module
        (the same object unless ``module`` itself is a BatchNorm)."""
        comm = comm if comm is not None else process_group
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, comm=comm)
            if module.affine:
                out.weight, out.bias = module.weight, module.bias
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                out._buffers[name] = module._buffers[name]
            out.train(module.training)
            return out
        for name, child in list(module._modules.items()):
            if child is not None:
                new = cls.convert_sync_batchnorm(child, comm)
                if new is not child:
                    module._modules[name] = new
        return module

    def extra_repr(self):
        return super().extra_repr() + ", synchronised"


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
