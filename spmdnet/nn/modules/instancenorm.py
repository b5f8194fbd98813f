"""``nn.InstanceNorm1d/2d`` (PyTorch's ``torch.nn.modules.instancenorm``):
``affine=False`` and ``track_running_stats=False`` by default (PyTorch's);
with running statistics they carry ``running_mean``, ``running_var`` and
``num_batches_tracked`` as BatchNorm does.
"""
from .. import functional as F
from .batchnorm import _NormBase


class _InstanceNorm(_NormBase):
    """Shared by InstanceNorm1d/2d (``_spatial_dims`` differs); unbatched
    input (C, *) is taken as a batch of one."""

    _spatial_dims = 0

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None):
        # PyTorch's defaults differ from BatchNorm's: no affine, no running stats
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device, dtype)

    def forward(self, input):  # noqa: A002 - PyTorch's name
        name, dims = type(self).__name__, self._spatial_dims
        if input.ndim not in (dims + 1, dims + 2):
            raise ValueError(f"{name}: expected {dims + 1}D or {dims + 2}D input (got "
                             f"{input.ndim}D input)")
        batched = input.ndim == dims + 2
        x = input if batched else input.unsqueeze(0)
        if (self.affine or self.track_running_stats) and x.shape[1] != self.num_features:
            raise ValueError(f"{name}: expected input's size at dim={1 if batched else 0} to "
                             f"match num_features ({self.num_features}), but got: "
                             f"{x.shape[1]}.")
        # as PyTorch: num_batches_tracked stays 0 and momentum=None moves nothing
        momentum = 0.0 if self.momentum is None else self.momentum
        out = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                              self.training or not self.track_running_stats, momentum, self.eps)
        return out if batched else out.squeeze(0)


class InstanceNorm1d(_InstanceNorm):
    """(N, C, L) or (C, L) input."""

    _spatial_dims = 1


class InstanceNorm2d(_InstanceNorm):
    """(N, C, H, W) or (C, H, W) input."""

    _spatial_dims = 2
