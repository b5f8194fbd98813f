"""Reductions over dims, PyTorch's names and semantics: sum, mean, var, std,
prod, amax / amin, logsumexp, norm; max / min (a value, or a named
``(values, indices)`` pair with a dim), argmax / argmin, any, all.

``dim`` is None, an int or a tuple; ``axis=`` and ``keepdims=`` are accepted
as aliases of ``dim=`` and ``keepdim=``. Ties share the gradient evenly in
``amax``/``amin`` and the no-dim ``max()``/``min()``; ``max(dim)`` gives the
whole gradient to the returned index, as PyTorch's.
"""
import math
import operator
from collections import namedtuple

import numpy as np

from .._tensor import Tensor
from ..autograd import Function
from ..backend import xp_of
from ._util import dim_arg, expand_reduced, normalize_axes
from .convert import cast
from .select import maximum, minimum
from .unary import Sqrt
from .unary import abs as abs_

MaxResult = namedtuple("max", ["values", "indices"])  # torch.return_types.max
MinResult = namedtuple("min", ["values", "indices"])


def _count(shape, axes):
    return math.prod(shape[ax] for ax in axes)


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
        self.count = _count(a.shape, self.axes)
        return a.mean(axis=self.axes, keepdims=keepdims)

    def backward(self, g):
        g = expand_reduced(g, self.shape, self.axes, self.keepdims) / self.count
        return xp_of(g).broadcast_to(g, self.shape)


class Var(Function):
    """Variance with ``correction`` (N - correction in the denominator)."""

    def forward(self, a, axis=None, keepdims=False, correction=1):
        self.axes, self.keepdims = normalize_axes(axis, a.ndim), keepdims
        self.centered = a - a.mean(axis=self.axes, keepdims=True)
        self.denom = _count(a.shape, self.axes) - correction
        sq = (self.centered * self.centered).sum(axis=self.axes, keepdims=keepdims)
        return sq / self.denom if self.denom > 0 else sq * float("inf")

    def backward(self, g):
        g = expand_reduced(g, self.centered.shape, self.axes, self.keepdims)
        return g * self.centered * (2 / self.denom if self.denom > 0 else float("nan"))


class Prod(Function):
    """Product; its gradient is the product of the other elements (exclusive
    cumulative products, so zeros are exact)."""

    def forward(self, a, axis=None, keepdims=False):
        self.a, self.keepdims = a, keepdims
        self.axes = normalize_axes(axis, a.ndim)
        return a.prod(axis=self.axes, keepdims=keepdims)

    def backward(self, g):
        a, axes, xp = self.a, self.axes, xp_of(g)
        g = expand_reduced(g, a.shape, axes, self.keepdims)
        perm = [i for i in range(a.ndim) if i not in axes] + list(axes)
        flat = a.transpose(perm).reshape([a.shape[i] for i in perm[:a.ndim - len(axes)]] + [-1])
        if flat.shape[-1] == 0:
            return xp.zeros(a.shape, g.dtype)
        ones = xp.ones(flat.shape[:-1] + (1,), a.dtype)
        left = xp.cumprod(xp.concatenate([ones, flat[..., :-1]], -1), -1)
        rev = xp.flip(flat, -1)[..., :-1]
        right = xp.flip(xp.cumprod(xp.concatenate([ones, rev], -1), -1), -1)
        others = (left * right).reshape([a.shape[i] for i in perm])
        return g * others.transpose([perm.index(i) for i in range(a.ndim)])


class Amax(Function):
    """Maximum (``sign`` 1) or minimum (-1) over dims; ties share the
    gradient evenly, as PyTorch's amax/amin."""

    sign = 1

    def forward(self, a, axis=None, keepdims=False):
        self.axes = normalize_axes(axis, a.ndim)
        if 0 in [a.shape[ax] for ax in self.axes]:
            raise IndexError(f"{type(self).__name__.lower()}(): cannot reduce over an empty "
                             f"dim of a tensor of shape {a.shape}")
        self.a, self.keepdims = a, keepdims
        self.out = (a.max if self.sign > 0 else a.min)(axis=self.axes, keepdims=True)
        return self.out if keepdims else self.out.reshape(
            [n for i, n in enumerate(a.shape) if i not in self.axes])

    def backward(self, g):
        g = expand_reduced(g, self.a.shape, self.axes, self.keepdims)
        mask = self.a == self.out
        return mask * (g / mask.sum(axis=self.axes, keepdims=True))


class Amin(Amax):
    sign = -1


class SelectAlong(Function):
    """a's element at ``index`` (size 1 along ``axis``, from argmax/argmin):
    max(dim)'s values; the whole gradient goes to that index."""

    def forward(self, a, index, axis, keepdims):
        self.shape, self.index, self.axis = a.shape, index, axis
        out = xp_of(a).take_along_axis(a, index, axis)
        return out if keepdims else out.squeeze(axis)

    def backward(self, g):
        xp = xp_of(g)
        g = xp.expand_dims(g, self.axis) if g.ndim < len(self.shape) else g
        pos = xp.arange(self.shape[self.axis]).reshape(
            [-1 if i == self.axis else 1 for i in range(g.ndim)])
        return xp.where(pos == self.index, g, xp.zeros((), g.dtype))


class LogSumExp(Function):
    def forward(self, a, axis=None, keepdims=False):
        xp = xp_of(a)
        self.a, self.axes, self.keepdims = a, normalize_axes(axis, a.ndim), keepdims
        m = a.max(axis=self.axes, keepdims=True) if a.size else xp.zeros((1,) * a.ndim, a.dtype)
        m = xp.where(xp.isfinite(m), m, xp.zeros((), a.dtype))
        self.out = xp.log(xp.exp(a - m).sum(axis=self.axes, keepdims=True)) + m
        return self.out if keepdims else self.out.reshape(
            [n for i, n in enumerate(a.shape) if i not in self.axes])

    def backward(self, g):
        g = expand_reduced(g, self.a.shape, self.axes, self.keepdims)
        return g * xp_of(g).exp(self.a - self.out)


class Norm(Function):
    """The p-norm (finite p > 0) over dims; its gradient is 0 where the norm is 0."""

    def forward(self, a, p=2, axis=None, keepdims=False):
        xp = xp_of(a)
        self.a, self.p, self.keepdims = a, p, keepdims
        self.axes = normalize_axes(axis, a.ndim)
        if p == 2:
            self.out = xp.sqrt((a * a).sum(axis=self.axes, keepdims=True))
        else:
            self.out = (xp.abs(a) ** p).sum(axis=self.axes, keepdims=True) ** (1 / p)
        return self.out if keepdims else self.out.reshape(
            [n for i, n in enumerate(a.shape) if i not in self.axes])

    def backward(self, g):
        xp, a, p = xp_of(g), self.a, self.p
        g = expand_reduced(g, a.shape, self.axes, self.keepdims)
        safe = xp.where(self.out == 0, xp.ones((), a.dtype), self.out)
        if p == 2:
            return g * a / safe
        return g * xp.sign(a) * (xp.abs(a) / safe) ** (p - 1)


def _prepare(input, dtype):  # noqa: A002 - PyTorch's argument name
    return input if dtype is None else cast(input, np.dtype(dtype))


def _reduction(cls, name):
    def reduce(input, dim=None, keepdim=False, *, dtype=None, axis=None, keepdims=None):  # noqa: A002
        dim, keepdim = dim_arg(name, dim, axis, keepdim, keepdims)
        return cls.apply(_prepare(input, dtype), axis=dim, keepdims=keepdim)
    reduce.__name__ = name
    return reduce


sum, prod = _reduction(Sum, "sum"), _reduction(Prod, "prod")  # noqa: A001 - PyTorch's names


def mean(input, dim=None, keepdim=False, *, dtype=None, axis=None, keepdims=None):  # noqa: A002
    dim, keepdim = dim_arg("mean", dim, axis, keepdim, keepdims)
    input = _prepare(input, dtype)
    if input.dtype.kind not in "fcV":  # "V": bfloat16 (dtypes.py)
        raise RuntimeError("mean(): could not infer output dtype. Input dtype must be either "
                           f"a floating point or complex dtype. Got: {input.dtype}")
    return Mean.apply(input, axis=dim, keepdims=keepdim)


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None, axis=None,  # noqa: A002
        keepdims=None):
    """Variance; PyTorch's default correction is 1 (Bessel's), ``unbiased=False``
    or ``correction=0`` gives the population variance. ``var(False)`` is
    the legacy ``var(unbiased)``."""
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    dim, keepdim = dim_arg("var", dim, axis, keepdim, keepdims)
    if unbiased is not None and correction is not None:
        raise TypeError("var(): give either unbiased= or correction=, not both")
    if correction is None:
        correction = 1 if unbiased is None else int(bool(unbiased))
    if input.dtype.kind not in "fcV":  # "V": bfloat16 (dtypes.py)
        raise RuntimeError(f"var(): input dtype must be floating point, got {input.dtype}")
    return Var.apply(input, axis=dim, keepdims=keepdim, correction=correction)


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None, axis=None,  # noqa: A002
        keepdims=None):
    """sqrt(var(...)), the same arguments."""
    return Sqrt.apply(var(input, dim, unbiased, keepdim, correction=correction, axis=axis,
                          keepdims=keepdims))


def amax(input, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A002
    dim, keepdim = dim_arg("amax", dim, axis, keepdim, keepdims)
    return Amax.apply(input, axis=None if dim == () else dim, keepdims=keepdim)


def amin(input, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A002
    dim, keepdim = dim_arg("amin", dim, axis, keepdim, keepdims)
    return Amin.apply(input, axis=None if dim == () else dim, keepdims=keepdim)


def logsumexp(input, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A002
    """log(sum(exp(x))) over dims, computed without overflow."""
    dim, keepdim = dim_arg("logsumexp", dim, axis, keepdim, keepdims)
    return LogSumExp.apply(input, axis=dim, keepdims=keepdim)


def _one_dim(name, dim, ndim):
    """``dim`` as one non-negative int, or a TypeError naming the call."""
    if isinstance(dim, (tuple, list)) or isinstance(dim, bool):
        hint = f"; use a{name}(dim=...) to reduce over several dims" \
            if name in ("max", "min") else ""
        raise TypeError(f"{name}(dim) takes one int dim, got {dim!r}{hint}")
    dim = operator.index(dim)
    return normalize_axes(dim, ndim)[0] if ndim else 0


def _arg_index(name, a, dim, keepdim):
    xp = xp_of(a.array)
    if dim is None:
        flat = a.array.reshape(-1)
        if flat.size == 0:
            raise IndexError(f"{name}(): cannot take the {name} of an empty tensor")
        index = getattr(xp, name)(flat).astype(xp.int64)
        return Tensor(index.reshape((1,) * a.ndim) if keepdim else index)
    axis = _one_dim(name, dim, a.ndim)
    if a.ndim and a.shape[axis] == 0:
        raise IndexError(f"{name}(): expected reduction dim {dim} to have non-zero size "
                         f"(shape {a.shape})")
    data = a.array if a.ndim else a.array.reshape(1)
    index = getattr(xp, name)(data, axis=axis, keepdims=True).astype(xp.int64)
    return Tensor(index if keepdim or not a.ndim else index.squeeze(axis))


def argmax(input, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A002
    """Index of the maximum (of the flattened tensor when dim is None)."""
    return _arg_index("argmax", input, *dim_arg("argmax", dim, axis, keepdim, keepdims))


def argmin(input, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A002
    return _arg_index("argmin", input, *dim_arg("argmin", dim, axis, keepdim, keepdims))


def _extreme(name, input, dim, keepdim, axis, keepdims):  # noqa: A002
    if isinstance(dim, Tensor):  # torch.max(a, b) is the elementwise maximum
        return (maximum if name == "max" else minimum)(input, dim)
    dim, keepdim = dim_arg(name, dim, axis, keepdim, keepdims)
    cls, pair = (Amax, MaxResult) if name == "max" else (Amin, MinResult)
    if dim is None:
        return cls.apply(input, axis=None, keepdims=keepdim)
    axis = _one_dim(name, dim, input.ndim)
    index = _arg_index(f"arg{name}", input, dim, True)
    if not input.ndim:
        return pair(input, Tensor(index.array.reshape(())))
    values = SelectAlong.apply(input, index=index.array, axis=axis, keepdims=keepdim)
    return pair(values, index if keepdim else Tensor(index.array.squeeze(axis)))


def max(input, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A001,A002
    """The maximum; with an int ``dim`` a named pair ``(values, indices)``
    (indices int64, the first maximum's), as PyTorch's."""
    return _extreme("max", input, dim, keepdim, axis, keepdims)


def min(input, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A001,A002
    """The minimum; with an int ``dim`` a named pair ``(values, indices)``."""
    return _extreme("min", input, dim, keepdim, axis, keepdims)


def _logical_reduction(name):
    def reduce(input, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A002
        dim, keepdim = dim_arg(name, dim, axis, keepdim, keepdims)
        data = input.array if isinstance(input, Tensor) else input
        axes = normalize_axes(dim, data.ndim)
        return Tensor(getattr(xp_of(data), name)(data, axis=axes, keepdims=keepdim))
    reduce.__name__ = name
    return reduce


any, all = _logical_reduction("any"), _logical_reduction("all")  # noqa: A001


def norm(input, p="fro", dim=None, keepdim=False, dtype=None, *, axis=None,  # noqa: A002
         keepdims=None):
    """The p-norm over dims (all by default): p a number, inf, -inf or
    'fro' (2); the gradient is 0 where the norm is 0."""
    dim, keepdim = dim_arg("norm", dim, axis, keepdim, keepdims)
    input = _prepare(input, dtype)
    if input.dtype.kind not in "fcV":  # "V": bfloat16 (dtypes.py)
        raise RuntimeError(f"norm(): input dtype must be floating point, got {input.dtype}")
    if p == "fro":
        p = 2
    if isinstance(p, str):
        raise ValueError(f"norm(): p must be a number, inf or 'fro', got {p!r} "
                         "(use a matrix-norm routine for 'nuc')")
    if p in (math.inf, -math.inf):
        return (amax if p > 0 else amin)(abs_(input), dim, keepdim)
    if p == 0:
        return Tensor((input.array != 0).sum(axis=normalize_axes(dim, input.ndim),
                                            keepdims=keepdim).astype(input.dtype))
    return Norm.apply(input, p=p, axis=dim, keepdims=keepdim)
