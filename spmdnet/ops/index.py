"""Indexing and joining ops: ``a[index]``, split / chunk / unbind, cat /
stack, tril / triu, with PyTorch's names and semantics."""
import math

import numpy as np

from .._tensor import Tensor
from ..autograd import Function
from ..backend import is_cupy_array, scatter_add, to_device, xp_of
from .._args import canonical_dim


def _unwrap(i, on_gpu):
    """An index part as an array on the indexed tensor's device (PyTorch
    accepts host index tensors for a GPU tensor)."""
    i = i.array if isinstance(i, Tensor) else i
    return to_device(i, "gpu") if on_gpu and isinstance(i, np.ndarray) else i


def unwrap_index(index, data):
    """``index`` (a part or a tuple of parts) for indexing the array ``data``."""
    on_gpu = is_cupy_array(data)
    if isinstance(index, tuple):
        return tuple(_unwrap(i, on_gpu) for i in index)
    return _unwrap(index, on_gpu)


def _is_array(p):
    return hasattr(p, "shape") and getattr(p, "ndim", 0) > 0 or isinstance(p, list)


def _without_masks(index, xp):
    """``index`` with each boolean array replaced by its ``nonzero()``
    coordinates: NumPy's meaning of a mask, in a form ``scatter_add`` reads
    right (``np.add.at`` takes a boolean array for 0/1 integers)."""
    parts = index if isinstance(index, tuple) else (index,)
    out = []
    for p in parts:
        if isinstance(p, list):
            p = xp.asarray(p)
        is_mask = hasattr(p, "dtype") and p.dtype.kind == "b" and p.ndim > 0
        out.extend(p.nonzero() if is_mask else (p,))
    return tuple(out)


class Index(Function):
    """a[index]: basic (slices, ints, None, ...), integer-array or boolean
    mask indexing. Integer arrays may repeat an element, so backward
    scatter-adds."""

    def forward(self, a, index):
        self.shape, self.dtype, self.index = a.shape, a.dtype, index
        return a[index]

    def backward(self, g):
        xp = xp_of(g)
        out = xp.zeros(self.shape, dtype=self.dtype)
        parts = self.index if isinstance(self.index, tuple) else (self.index,)
        if any(_is_array(p) for p in parts):
            scatter_add(out, _without_masks(self.index, xp), g)
        else:
            out[self.index] = g
        return out

    def backward_add(self, acc, g):
        """acc += backward(g), touching only the indexed elements (the
        engine's shortcut when the input has a gradient already)."""
        parts = self.index if isinstance(self.index, tuple) else (self.index,)
        if any(_is_array(p) for p in parts):
            scatter_add(acc, _without_masks(self.index, xp_of(acc)), g)
        else:
            acc[self.index] += g


class Concatenate(Function):
    def forward(self, *arrays, axis=0):
        self.axis = axis
        self.sizes = [a.shape[axis] for a in arrays]
        return xp_of(*arrays).concatenate(arrays, axis=axis)

    def backward(self, g):
        xp, splits, acc = xp_of(g), [], 0
        for n in self.sizes[:-1]:
            acc += n
            splits.append(acc)
        parts = xp.split(g, splits, axis=self.axis)
        return tuple(p if need else None for p, need in zip(parts, self.needs_input_grad))


class Stack(Function):
    def forward(self, *arrays, axis=0):
        self.axis = axis
        return xp_of(*arrays).stack(arrays, axis=axis)

    def backward(self, g):
        xp = xp_of(g)
        parts = [xp.take(g, i, axis=self.axis) for i in range(g.shape[self.axis])]
        return tuple(p if need else None for p, need in zip(parts, self.needs_input_grad))


class Triangle(Function):
    """The lower (``upper=False``) or upper triangle of the last two dims,
    from ``diagonal`` on; the rest zero."""

    def forward(self, a, diagonal, upper):
        self.diagonal, self.upper = diagonal, upper
        return self._mask(a)

    def _mask(self, x):
        xp = xp_of(x)
        return (xp.triu if self.upper else xp.tril)(x, self.diagonal)

    def backward(self, g):
        return self._mask(g)


def getitem(a, index):
    """``a[index]`` with NumPy's (and PyTorch's) indexing: ints (negative
    from the end), slices, None, Ellipsis, integer arrays and boolean masks,
    each possibly a Tensor."""
    return Index.apply(a, index=unwrap_index(index, a.array))


def narrow(a, dim, start, length):
    """Elements ``start .. start+length`` of dim ``dim``."""
    d = canonical_dim(dim, a.ndim)
    start = start + a.shape[d] if start < 0 else start
    if not 0 <= start <= start + length <= a.shape[d]:
        raise RuntimeError(f"narrow(): start ({start}) + length ({length}) exceeds dimension "
                           f"size ({a.shape[d]}).")
    return Index.apply(a, index=(slice(None),) * d + (slice(start, start + length),))


def split(a, split_size_or_sections, dim=0):
    """Pieces along ``dim``: of ``split_size`` each (the last may be smaller),
    or of the listed sizes, which must add up to the dim's size."""
    d = canonical_dim(dim, a.ndim)
    n = a.shape[d]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} "
                               f"(input tensor's size at dimension {d}), but got "
                               f"split_sizes={sizes}")
    else:
        size = int(split_size_or_sections)
        if size <= 0 and n:
            raise RuntimeError(f"split expects split_size be non-negative (and positive for a "
                               f"non-empty dim), but got split_size={size}")
        sizes = [min(size, n - i) for i in range(0, n, size)] if n else [0]
    out, at = [], 0
    for s in sizes:
        out.append(narrow(a, d, at, s))
        at += s
    return tuple(out)


def chunk(a, chunks, dim=0):
    """At most ``chunks`` pieces along ``dim``, each ``ceil(n / chunks)``
    long except the last (so there may be fewer pieces, as PyTorch)."""
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    n = a.shape[canonical_dim(dim, a.ndim)]
    return split(a, max(1, math.ceil(n / chunks)), dim)


def unbind(a, dim=0):
    """The slices along ``dim``, each without that dim."""
    d = canonical_dim(dim, a.ndim)
    return tuple(Index.apply(a, index=(slice(None),) * d + (i,)) for i in range(a.shape[d]))


def _dim_arg(dim, axis, default=0):
    if axis is not None and dim is not None and axis != dim:
        raise TypeError(f"got both dim={dim} and its alias axis={axis}")
    return dim if dim is not None else axis if axis is not None else default


def _check_sizes(tensors, skip, what):
    first = tensors[0].shape
    for k, t in enumerate(tensors[1:], 1):
        if len(t.shape) != len(first):
            raise RuntimeError(f"{what}: tensors must have the same number of dimensions: "
                               f"got {len(first)} and {len(t.shape)} (tensor number {k})")
        for i, (n, m) in enumerate(zip(first, t.shape)):
            if i != skip and n != m:
                raise RuntimeError(f"{what}: sizes of tensors must match except in dimension "
                                   f"{skip}. Expected size {n} but got size {m} for tensor "
                                   f"number {k} in the list.")


def cat(tensors, dim=None, *, axis=None):
    """The tensors joined along an existing dim (``axis=`` is an alias)."""
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("cat(): expected a non-empty list of Tensors")
    d = canonical_dim(_dim_arg(dim, axis), tensors[0].ndim)
    _check_sizes(tensors, d, "cat")
    return Concatenate.apply(*tensors, axis=d)


concatenate = concat = cat


def stack(tensors, dim=None, *, axis=None):
    """The tensors joined along a new dim ``dim`` (``axis=`` is an alias)."""
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    for k, t in enumerate(tensors[1:], 1):
        if t.shape != tensors[0].shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got "
                               f"{list(tensors[0].shape)} at entry 0 and {list(t.shape)} "
                               f"at entry {k}")
    d = canonical_dim(_dim_arg(dim, axis), tensors[0].ndim + 1)
    return Stack.apply(*tensors, axis=d)


def _triangle(upper):
    def triangle(a, diagonal=0):
        if a.ndim < 2:
            raise RuntimeError(f"{'triu' if upper else 'tril'}: input tensor must have at "
                               f"least 2 dimensions, got {a.ndim}")
        return Triangle.apply(a, diagonal=int(diagonal), upper=upper)
    triangle.__name__ = "triu" if upper else "tril"
    triangle.__doc__ = (f"The {'upper' if upper else 'lower'} triangle of the last two "
                        "dims from ``diagonal`` on (0 the main diagonal), the rest zero.")
    return triangle


tril, triu = _triangle(False), _triangle(True)
