"""Batch normalization layers, PyTorch's arguments, buffers and state_dict
keys: ``weight``, ``bias``, ``running_mean``, ``running_var``,
``num_batches_tracked`` (int64). The synchronised form, over a group of
ranks, is ``spmdnet.parallel.SyncBatchNorm`` (also ``nn.SyncBatchNorm``).
"""
import numpy as np

from .. import functional as F
from ..._tensor import get_default_dtype
from .. import init
from .module import Module
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
        if device is not None:
            self.to(device)

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
