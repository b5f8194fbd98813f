"""``nn.LayerNorm`` and ``nn.GroupNorm`` (PyTorch's ``torch.nn.modules.normalization``),
PyTorch's arguments and state_dict keys.

``LayerNorm``: ``weight`` (ones) and ``bias`` (zeros) of ``normalized_shape``.
``GroupNorm``: ``weight`` (ones) and ``bias`` (zeros), (C,), when ``affine``.
"""
from .. import functional as F
from .. import init
from ..parameter import Parameter
from .module import Module
from .utils import _empty, _move


class LayerNorm(Module):
    """Normalise over the last ``len(normalized_shape)`` dims; weight ones,
    bias zeros (``bias=False``: no bias; ``elementwise_affine=False``: neither)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(n) for n in normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight = self.bias = None
        if elementwise_affine:
            self.weight = Parameter(_empty(self.normalized_shape, dtype, device))
            if bias:
                self.bias = Parameter(_empty(self.normalized_shape, dtype, device))
        self.reset_parameters()
        _move(self, device)

    def reset_parameters(self):
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class GroupNorm(Module):
    """Normalise (N, C, *) input over each of ``num_groups`` channel groups."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None,
                 dtype=None):
        super().__init__()
        if num_groups <= 0 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by "
                             f"num_groups ({num_groups})")
        self.num_groups, self.num_channels = num_groups, num_channels
        self.eps, self.affine = eps, affine
        self.weight = Parameter(_empty((num_channels,), dtype, device)) if affine else None
        self.bias = Parameter(_empty((num_channels,), dtype, device)) if affine else None
        self.reset_parameters()
        _move(self, device)

    def reset_parameters(self):
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, input):  # noqa: A002 - PyTorch's name
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"
