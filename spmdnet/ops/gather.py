"""Index-driven ops with PyTorch's semantics: ``gather``, ``scatter``,
``scatter_add``, ``index_select``, ``repeat_interleave`` and ``diag``.

``gather(dim, index)``: ``out[i][j][k] = input[index[i][j][k]][j][k]`` for
``dim=0`` (so ``out`` has ``index``'s shape; ``index`` may be smaller than
``input`` in the other dims). ``scatter(dim, index, src)`` is its inverse:
a copy of ``input`` with ``out[index[i][j][k]][j][k] = src[i][j][k]``;
``scatter_add`` adds instead (repeats add up). Indices must lie in
``[0, size)``; others raise RuntimeError, as PyTorch.
"""
import numpy as np

from .._tensor import Tensor, _as_array
from ..autograd import Function
from ..backend import scatter_add as _scatter_add
from ..backend import asnumpy, to_device, xp_of
from .index import Index
from .._args import canonical_dim
from .._meta import is_meta_array


def _coords(index, axis):
    """Full index tuple addressing ``input`` at ``index`` along ``axis``."""
    xp, ndim = xp_of(index), index.ndim
    return tuple(index if d == axis else
                 xp.arange(n).reshape((1,) * d + (n,) + (1,) * (ndim - d - 1))
                 for d, n in enumerate(index.shape))


def _region(shape):
    return tuple(slice(0, n) for n in shape)


class Gather(Function):
    def forward(self, a, index, axis):
        self.shape, self.dtype = a.shape, a.dtype
        self.coords = _coords(index, axis)
        return a[self.coords]

    def backward(self, g):
        out = xp_of(g).zeros(self.shape, dtype=self.dtype)
        _scatter_add(out, self.coords, g)
        return out


class Scatter(Function):
    """``input`` with ``src`` written (``add=False``) or added at ``index``;
    both inputs get gradients."""

    def forward(self, a, src, index, axis, add):
        self.coords, self.add, self.src_shape = _coords(index, axis), add, src.shape
        self.region = _region(index.shape)
        out = a.copy()
        values = src[self.region]
        if add:
            _scatter_add(out, self.coords, values)
        else:
            out[self.coords] = values
        return out

    def backward(self, g):
        xp = xp_of(g)
        ga = gs = None
        if self.needs_input_grad[0]:
            ga = g if self.add else g.copy()
            if not self.add:
                ga[self.coords] = 0
        if self.needs_input_grad[1]:
            gs = xp.zeros(self.src_shape, dtype=g.dtype)
            gs[self.region] = g[self.coords]
        return ga, gs


def _index(input, dim, index, what):  # noqa: A002
    """(axis, index array on input's device), checked as PyTorch checks."""
    axis = canonical_dim(dim, input.ndim)
    idx = _as_array(index)
    idx = to_device(idx, input.device) if hasattr(idx, "shape") else idx
    if idx.dtype.kind not in "iu":
        raise RuntimeError(f"{what}(): Expected dtype int64 for index, got {idx.dtype}")
    if idx.ndim != input.ndim and input.ndim:
        raise RuntimeError(f"{what}(): Index tensor must have the same number of dimensions "
                           f"as input tensor ({idx.ndim} vs {input.ndim})")
    for d, (n, m) in enumerate(zip(idx.shape, input.shape)):
        if d != axis and n > m:
            raise RuntimeError(f"{what}(): Size does not match at dimension {d} expected "
                               f"index {tuple(idx.shape)} to be no larger than self "
                               f"{tuple(input.shape)} apart from dimension {axis}")
    _check_range(idx, input.shape[axis] if input.ndim else 1, what)
    return axis, idx.reshape(idx.shape if input.ndim else (1,))


def _check_range(idx, n, what):
    if is_meta_array(idx):  # a meta index's values are unknown: PyTorch checks none either
        return
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
        raise RuntimeError(f"{what}(): index {bad} is out of bounds for dimension with size {n}")


def gather(input, dim, index, *, sparse_grad=False):  # noqa: A002 - PyTorch's names
    """Values of ``input`` picked along ``dim`` by ``index`` (``index``'s shape)."""
    axis, idx = _index(input, dim, index, "gather")
    src = input if input.ndim else input.reshape(1)
    return Gather.apply(src, index=idx, axis=axis).reshape(idx.shape if input.ndim else ())


def _scatter(input, dim, index, src, add, what):  # noqa: A002
    axis, idx = _index(input, dim, index, what)
    if isinstance(src, (bool, int, float)):
        src = Tensor(xp_of(input.array).full(idx.shape, src, dtype=input.dtype))
    src = src if isinstance(src, Tensor) else Tensor(_as_array(src))
    if src.dtype != input.dtype:
        raise RuntimeError(f"{what}(): Expected self.dtype to be equal to src.dtype "
                           f"({input.dtype} vs {src.dtype})")
    elif any(n > m for n, m in zip(idx.shape, src.shape)):
        raise RuntimeError(f"{what}(): Expected index {tuple(idx.shape)} to be no larger "
                           f"than src {tuple(src.shape)}")
    return Scatter.apply(input, src, index=idx, axis=axis, add=add)


def scatter(input, dim, index, src=None, *, value=None, reduce=None):  # noqa: A002
    """A copy of ``input`` with ``src`` (a tensor, or a number: ``value``)
    written at ``index`` along ``dim``."""
    if reduce is not None:
        raise NotImplementedError("scatter(reduce=...): use scatter_add")
    return _scatter(input, dim, index, value if src is None else src, False, "scatter")


def scatter_add(input, dim, index, src):  # noqa: A002
    """A copy of ``input`` with ``src`` added at ``index`` along ``dim``."""
    return _scatter(input, dim, index, src, True, "scatter_add")


def index_select(input, dim, index):  # noqa: A002
    """The slices ``index`` (a 1-D integer tensor) of ``input`` along ``dim``."""
    axis = canonical_dim(dim, input.ndim)
    idx = _as_array(index)
    if idx.ndim > 1 or idx.dtype.kind not in "iu":
        raise RuntimeError("index_select(): Index is supposed to be a vector of integers")
    idx = to_device(idx.reshape(-1), input.device)
    _check_range(idx, input.shape[axis] if input.ndim else 1, "index_select")
    if input.ndim == 0:
        return Index.apply(input.reshape(1), index=idx).reshape(idx.shape if idx.size > 1 else ())
    return Index.apply(input, index=(slice(None),) * axis + (idx,))


def repeat_interleave(input, repeats, dim=None, *, output_size=None):  # noqa: A002
    """Each element (``dim=None``: of the flattened tensor) repeated
    ``repeats`` times (an int, or a tensor with one count per element)."""
    if dim is None:
        input, dim = input.reshape(-1), 0
    axis = canonical_dim(dim, input.ndim)
    counts = asnumpy(_as_array(repeats))
    if counts.ndim and counts.size not in (1, input.shape[axis]):
        raise RuntimeError(f"repeat_interleave(): repeats must have the same size as input "
                           f"along dim ({counts.size} vs {input.shape[axis]})")
    idx = np.repeat(np.arange(input.shape[axis]), counts.reshape(-1) if counts.ndim else counts)
    return Index.apply(input, index=(slice(None),) * axis + (to_device(idx, input.device),))


class Diag(Function):
    """1-D -> the matrix with it on diagonal ``k``; 2-D -> diagonal ``k``."""

    def forward(self, a, k):
        self.shape, self.k = a.shape, k
        out = xp_of(a).diag(a, k)
        return out.copy() if a.ndim == 2 else out

    def backward(self, g):
        xp = xp_of(g)
        if len(self.shape) == 1:
            return xp.diagonal(g, self.k).copy()
        out = xp.zeros(self.shape, dtype=g.dtype)
        n = g.shape[0]
        rows = xp.arange(n) + max(-self.k, 0)
        out[rows, rows + self.k] = g
        return out


def diag(input, diagonal=0):  # noqa: A002
    """PyTorch's ``diag``: a 1-D tensor's diagonal matrix, or a 2-D tensor's
    ``diagonal``-th diagonal (above the main one when positive)."""
    if input.ndim not in (1, 2):
        raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {input.ndim}D")
    return Diag.apply(input, k=int(diagonal))
