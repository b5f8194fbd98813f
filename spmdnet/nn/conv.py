"""Convolution layers with PyTorch's constructors, default initialisation
(``kaiming_uniform_(weight, a=sqrt(5))``, bias U(±1/sqrt(fan_in))) and
``state_dict`` keys (``weight`` (out, in/groups, *kernel), ``bias``)."""

from .. import functional as F
from . import init
from .layers import _empty, _move
from .module import Module
from .parameter import Parameter


def _tuple(value, n, name):
    if isinstance(value, int):
        return (value,) * n
    value = tuple(int(v) for v in value)
    if len(value) != n:
        raise ValueError(f"expected {name} to be an int or a {n}-tuple, got {value}")
    return value


class _ConvNd(Module):
    dims = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros", device=None,
                 dtype=None):
        super().__init__()
        n = self.dims
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"{type(self).__name__}: in_channels ({in_channels}) and "
                             f"out_channels ({out_channels}) must be divisible by groups "
                             f"({groups})")
        if padding_mode != "zeros":
            raise NotImplementedError(f"{type(self).__name__}: padding_mode "
                                      f"{padding_mode!r} is not supported (only 'zeros')")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _tuple(kernel_size, n, "kernel_size")
        self.stride, self.dilation = _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation")
        if isinstance(padding, str):
            if padding not in ("valid", "same"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of "
                                 "{'valid', 'same'}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = _tuple(padding, n, "padding")
        self.padding_mode = padding_mode
        self.weight = Parameter(_empty((out_channels, in_channels // groups)
                                       + self.kernel_size, dtype))
        self.bias = Parameter(_empty((out_channels,), dtype)) if bias else None
        self.reset_parameters()
        _move(self, device)

    def reset_parameters(self):
        init.default_layer_init_(self.weight, self.bias)

    def extra_repr(self):
        text = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")
        if self.padding != (0,) * self.dims:
            text += f", padding={self.padding}"
        if self.dilation != (1,) * self.dims:
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text + ("" if self.bias is not None else ", bias=False")


class Conv2d(_ConvNd):
    """PyTorch's ``nn.Conv2d`` (padding_mode 'zeros' only)."""

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class Conv1d(_ConvNd):
    """PyTorch's ``nn.Conv1d`` (padding_mode 'zeros' only)."""
    dims = 1

    def forward(self, x):
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)
