"""Sorting along a dim: sort, argsort, topk. The values are differentiable
(each gradient goes back to the element's original position); indices are
int64 tensors. NaN sorts as the largest value, as PyTorch's."""
from collections import namedtuple

from .._tensor import Tensor
from ..autograd import Function
from ..backend import xp_of
from .reduce import _one_dim

SortResult = namedtuple("sort", ["values", "indices"])  # torch.return_types.sort
TopkResult = namedtuple("topk", ["values", "indices"])


class Permuted(Function):
    """The first k elements of a along ``axis`` in the order of the
    permutation ``order``; backward puts each gradient back in place."""

    def forward(self, a, order, axis, k):
        self.order, self.axis = order, axis
        take = order if k == a.shape[axis] else _head(order, axis, k)
        return xp_of(a).take_along_axis(a, take, axis)

    def backward(self, g):
        xp, axis = xp_of(g), self.axis
        missing = self.order.shape[axis] - g.shape[axis]
        if missing:
            pad = list(g.shape)
            pad[axis] = missing
            g = xp.concatenate([g, xp.zeros(pad, g.dtype)], axis)
        return xp.take_along_axis(g, xp.argsort(self.order, axis=axis), axis)


def _head(a, axis, k):
    """The first k entries of a along axis."""
    return a[(slice(None),) * axis + (slice(0, k),)]


def _order(a, axis, descending, stable=False):
    """The int64 permutation sorting a along axis; ties keep their order
    (also descending: the reversed array is sorted, then reversed back)."""
    xp = xp_of(a)
    kind = {"kind": "stable"} if stable else {}
    if not descending:
        return xp.argsort(a, axis=axis, **kind).astype(xp.int64, copy=False)
    order = xp.flip(xp.argsort(xp.flip(a, axis), axis=axis, **kind), axis)
    return (a.shape[axis] - 1 - order).astype(xp.int64, copy=False)


def sort(input, dim=-1, descending=False, stable=False, *, axis=None):  # noqa: A002
    """A named pair ``(values, indices)`` sorted along ``dim``."""
    axis = _one_dim("sort", dim if axis is None else axis, input.ndim)
    if not input.ndim:
        return SortResult(input, Tensor(xp_of(input.array).zeros((), "int64")))
    order = _order(input.array, axis, descending, stable)
    values = Permuted.apply(input, order=order, axis=axis, k=input.shape[axis])
    return SortResult(values, Tensor(order))


def argsort(input, dim=-1, descending=False, stable=False):  # noqa: A002
    return sort(input, dim, descending, stable).indices


def topk(input, k, dim=-1, largest=True, sorted=True):  # noqa: A002 - PyTorch's names
    """A named pair ``(values, indices)`` of the k largest (or smallest)
    elements along ``dim``, in sorted order (also when ``sorted=False``)."""
    axis = _one_dim("topk", dim, input.ndim)
    n = input.shape[axis] if input.ndim else 1
    if not 0 <= k <= n:
        raise RuntimeError(f"topk(): k ({k}) is out of range for dim {dim} of size {n}")
    if not input.ndim:
        return TopkResult(input, Tensor(xp_of(input.array).zeros((), "int64")))
    order = _order(input.array, axis, largest)
    values = Permuted.apply(input, order=order, axis=axis, k=k)
    return TopkResult(values, Tensor(_head(order, axis, k)))
