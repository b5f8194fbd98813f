"""Pooling layers with PyTorch's constructors (no parameters)."""
from .. import functional as F
from .module import Module


class _Pool2d(Module):
    """What every 2-D pooling window has; ``stride`` defaults to ``kernel_size``."""

    def __init__(self, kernel_size, stride, padding, ceil_mode):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.ceil_mode = padding, ceil_mode


class MaxPool2d(_Pool2d):
    """PyTorch's ``nn.MaxPool2d``."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__(kernel_size, stride, padding, ceil_mode)
        self.dilation, self.return_indices = dilation, return_indices

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(_Pool2d):
    """PyTorch's ``nn.AvgPool2d``."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__(kernel_size, stride, padding, ceil_mode)
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """PyTorch's ``nn.AdaptiveAvgPool2d``."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class AdaptiveMaxPool2d(AdaptiveAvgPool2d):
    """PyTorch's ``nn.AdaptiveMaxPool2d``."""

    def __init__(self, output_size, return_indices=False):
        super().__init__(output_size)
        self.return_indices = return_indices

    def forward(self, x):
        return F.adaptive_max_pool2d(x, self.output_size, self.return_indices)
