"""Reductions over axes, with keepdims: sum, mean, max."""
from ..backend import xp_of
from ..autograd import Function
from ._util import expand_reduced, normalize_axes


class Sum(Function):
    def forward(self, a, axis=None, keepdims=False):
        self.shape, self.keepdims = a.shape, keepdims
        self.axes = normalize_axes(axis, a.ndim)
        return a.sum(axis=self.axes, keepdims=keepdims)

    def backward(self, g):
        g = expand_reduced(g, self.shape, self.axes, self.keepdims)
        return xp_of(g).broadcast_to(g, self.shape)


class Mean(Function):
    def forward(self, a, axis=None, keepdims=False):
        self.shape, self.keepdims = a.shape, keepdims
        self.axes = normalize_axes(axis, a.ndim)
        self.count = 1
        for ax in self.axes:
            self.count *= a.shape[ax]
        return a.mean(axis=self.axes, keepdims=keepdims)

    def backward(self, g):
        g = expand_reduced(g, self.shape, self.axes, self.keepdims) / self.count
        return xp_of(g).broadcast_to(g, self.shape)


class Max(Function):
    """Maximum; ties share the gradient equally (as PyTorch's amax)."""

    def forward(self, a, axis=None, keepdims=False):
        self.axes = normalize_axes(axis, a.ndim)
        if a.size == 0:
            raise ValueError(f"max() of an empty tensor of shape {a.shape}")
        self.a, self.keepdims = a, keepdims
        self.out = a.max(axis=self.axes, keepdims=True)
        return self.out if keepdims else self.out.reshape(
            [n for i, n in enumerate(a.shape) if i not in self.axes])

    def backward(self, g):
        g = expand_reduced(g, self.a.shape, self.axes, self.keepdims)
        mask = self.a == self.out
        return mask * (g / mask.sum(axis=self.axes, keepdims=True))
