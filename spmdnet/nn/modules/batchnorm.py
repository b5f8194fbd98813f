"""Batch normalization layers, PyTorch's arguments, buffers and state_dict
keys: ``weight``, ``bias``, ``running_mean``, ``running_var``,
``num_batches_tracked`` (int64), and ``SyncBatchNorm``, the synchronised
form over a group of ranks (its communication is registered by
``spmdnet.parallel.sync_batchnorm``).
"""
import numpy as np

from .. import functional as F
from ..._tensor import get_default_dtype
from ...ops.batchnorm import batch_norm
from .. import init
from .module import Module
from .utils import _move
from ..parameter import Parameter


class _NormBase(Module):
    """Per-feature affine parameters and running statistics, shared by the
    batch norms and the instance norms (``instancenorm.py``), which
    differ only in how they normalise."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        dtype = np.dtype(dtype or get_default_dtype())
        self.weight = Parameter(np.ones(num_features, dtype)) if affine else None
        self.bias = Parameter(np.zeros(num_features, dtype)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", np.zeros(num_features, dtype))
            self.register_buffer("running_var", np.ones(num_features, dtype))
            self.register_buffer("num_batches_tracked", np.zeros((), np.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        _move(self, device)

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean.array[...] = 0
            self.running_var.array[...] = 1
            self.num_batches_tracked.array[...] = 0

    def reset_parameters(self):
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class _BatchNorm(_NormBase):
    """Shared by BatchNorm1d/2d/3d and SyncBatchNorm (``_check_input_dim`` differs).

    Training: normalise by the batch's statistics and (``track_running_stats``)
    move the running ones by ``momentum`` (None: the cumulative average over
    ``num_batches_tracked`` batches). Eval: normalise by the running
    statistics (by the batch's when there are none)."""

    def _check_input_dim(self, x):
        raise NotImplementedError

    def _factor(self):
        """The momentum of this forward; counts the batch (PyTorch's order)."""
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.array += 1
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked.array)
        return factor

    def _uses_batch_stats(self):
        return self.training or (self.running_mean is None and self.running_var is None)

    def _running(self):
        """The running statistics F.batch_norm reads or updates (or None, None)."""
        if not self.training or self.track_running_stats:
            return self.running_mean, self.running_var
        return None, None

    def forward(self, x):
        self._check_input_dim(x)
        factor = self._factor()
        return F.batch_norm(x, *self._running(), self.weight, self.bias,
                            self._uses_batch_stats(), factor, self.eps)


def _expect_dims(name, x, dims):
    if x.ndim not in dims:
        want = " or ".join(f"{d}D" for d in dims)
        raise ValueError(f"{name}: expected {want} input, got {x.ndim}D input of shape "
                         f"{tuple(x.shape)}")


class BatchNorm1d(_BatchNorm):
    """Over (N, C) or (N, C, L) input."""

    def _check_input_dim(self, x):
        _expect_dims("BatchNorm1d", x, (2, 3))


class BatchNorm2d(_BatchNorm):
    """Over (N, C, H, W) input."""

    def _check_input_dim(self, x):
        _expect_dims("BatchNorm2d", x, (4,))


class BatchNorm3d(_BatchNorm):
    """Over (N, C, D, H, W) input."""

    def _check_input_dim(self, x):
        _expect_dims("BatchNorm3d", x, (5,))


# How a SyncBatchNorm communicates: set by spmdnet.parallel.sync_batchnorm when
# it loads (``import spmdnet`` loads it), so nn never imports the layers above.
_SYNC_BACKEND = {}


def register_sync_backend(*, resolve, size, reducer):
    """Install the communication of SyncBatchNorm: ``resolve(process_group)``
    gives the group (None: the world), ``size(group)`` its number of ranks,
    ``reducer(group)`` the object the batch_norm op reduces with
    (``combine``, ``allreduce``) and the join protocol answers through
    (``allgather``, ``allreduce_host``)."""
    _SYNC_BACKEND.update(resolve=resolve, size=size, reducer=reducer)


def _sync(name):
    if not _SYNC_BACKEND:
        raise RuntimeError("SyncBatchNorm needs spmdnet's distributed layer: import spmdnet "
                           "(which registers it) before using the layer")
    return _SYNC_BACKEND[name]


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose training statistics are those of the whole
    group's batch (PyTorch's ``nn.SyncBatchNorm``): ``SyncBatchNorm(num_features,
    eps, momentum, affine, track_running_stats, process_group=None)``; ``comm``
    is spmdnet's name for ``process_group``; None is the world. Input (N, C, *).
    Eval mode (or a group of one rank) is plain batch normalization.

    Forward: one allgather of every rank's per-channel (count, mean, M2),
    combined by Chan's formula (ranks may hold different numbers of samples,
    even none); the running variance takes the group's unbiased variance.
    Backward: one allreduce of the two per-channel sums (of dy and dy·x̂).
    Weight and bias gradients stay local sums: DataParallel averages them.
    The communication is ``spmdnet.parallel.sync_batchnorm``'s."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None,
                 comm=None):
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
        """The group the statistics are synchronised over."""
        return _sync("resolve")(self.process_group)

    def _synced(self):
        """Whether this forward reduces (the same answer on every rank of the group)."""
        return self._uses_batch_stats() and self.training and \
            _sync("size")(self.group_comm()) > 1

    def _reducer(self):
        if self._group is None:  # collective over the group: first synchronised forward
            self._group = _sync("reducer")(self.group_comm())
        return self._group

    def forward(self, x):
        self._check_input_dim(x)
        if not self._synced():
            return super().forward(x)
        factor = self._factor()
        return batch_norm(x, *self._running(), self.weight, self.bias, True, factor,
                          self.eps, group=self._reducer())

    # -- the joinable protocol (nn/parallel/distributed.py's Join) ------------------------
    def join_shadow(self):
        """A rank out of data answers one iteration's reductions with zeros."""
        chain = self._join_chain or [self]
        if self is chain[0] and self._join_hook is not None:
            self._join_hook()  # DataParallel's buffer broadcast comes before any forward
        if self._synced():
            self._reducer().allgather(np.zeros(1 + 2 * self.num_features))
        if self is chain[-1]:
            for layer in reversed(chain):
                if layer._synced():
                    layer._reducer().allreduce_host(np.zeros((2, layer.num_features)))

    def join_done(self, last_rank):
        """Nothing to do: DataParallel hands every rank the last rank's buffers."""

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None, comm=None):
        """``module`` with every BatchNorm*d replaced by a SyncBatchNorm over
        the group (same parameters, buffers, mode); returns the new module
        (the same object unless ``module`` itself is a BatchNorm)."""
        group = comm if comm is not None else process_group
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_group=group)
            if module.affine:
                out.weight, out.bias = module.weight, module.bias
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                out._buffers[name] = module._buffers[name]
            out.train(module.training)
            return out
        for name, child in list(module._modules.items()):
            if child is not None:
                new = cls.convert_sync_batchnorm(child, group)
                if new is not child:
                    module._modules[name] = new
        return module

    def extra_repr(self):
        return super().extra_repr() + ", synchronised"
