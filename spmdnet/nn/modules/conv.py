"""Convolution layers with PyTorch's constructors, default initialisation
(``kaiming_uniform_(weight, a=sqrt(5))``, bias U(±1/sqrt(fan_in))) and
``state_dict`` keys (``weight`` (out, in/groups, *kernel), ``bias``)."""

from .. import functional as F
from .. import init
from .utils import _empty, _move
from .module import Module
from ..parameter import Parameter


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
        self.weight = Parameter(_empty(self._weight_shape(), dtype, device))
        self.bias = Parameter(_empty((out_channels,), dtype, device)) if bias else None
        self.reset_parameters()
        _move(self, device)

    def _weight_shape(self):
        return (self.out_channels, self.in_channels // self.groups) + self.kernel_size

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


class _ConvTransposeNd(_ConvNd):
    """PyTorch's transposed convolution layers: weight (in, out/groups,
    *kernel), initialised as PyTorch's (fan_in from the weight's dim 1)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode="zeros",
                 device=None, dtype=None):
        if isinstance(padding, str):
            raise ValueError(f"{type(self).__name__}: padding must be an int or a tuple, got "
                             f"{padding!r}")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)
        self.output_padding = _tuple(output_padding, self.dims, "output_padding")

    def _weight_shape(self):  # PyTorch's: fan_in (dim 1) is out/groups · kernel
        return (self.in_channels, self.out_channels // self.groups) + self.kernel_size

    def _output_padding(self, x, output_size):
        """PyTorch's output_size argument: the output_padding that gives it."""
        if output_size is None:
            return self.output_padding
        output_size = tuple(int(s) for s in output_size)[-self.dims:]
        spatial = tuple(x.shape[-self.dims:])
        if len(output_size) != self.dims:
            raise ValueError(f"{type(self).__name__}: output_size must have {self.dims} or "
                             f"{self.dims + 2} elements, got {output_size}")
        extra = []
        for size, want, k, s, p, d in zip(spatial, output_size, self.kernel_size, self.stride,
                                          self.padding, self.dilation):
            least = (size - 1) * s - 2 * p + d * (k - 1) + 1
            if not least <= want < least + s:
                raise ValueError(f"{type(self).__name__}: requested an output size of "
                                 f"{output_size}, but valid sizes range from {least} to "
                                 f"{least + s - 1} (for an input of {spatial})")
            extra.append(want - least)
        return tuple(extra)

    def extra_repr(self):
        text = super().extra_repr()
        if self.output_padding != (0,) * self.dims:
            text += f", output_padding={self.output_padding}"
        return text


class ConvTranspose2d(_ConvTransposeNd):
    """PyTorch's ``nn.ConvTranspose2d`` (padding_mode 'zeros' only)."""

    def forward(self, x, output_size=None):
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                  self._output_padding(x, output_size), self.groups,
                                  self.dilation)


class ConvTranspose1d(_ConvTransposeNd):
    """PyTorch's ``nn.ConvTranspose1d`` (padding_mode 'zeros' only)."""
    dims = 1

    def forward(self, x, output_size=None):
        return F.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding,
                                  self._output_padding(x, output_size), self.groups,
                                  self.dilation)
