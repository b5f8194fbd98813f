"""Shape ops with PyTorch's names and semantics: reshape / view, permute,
transpose (two dims), flatten / unflatten, squeeze / unsqueeze, expand,
repeat, contiguous.

Dims follow PyTorch: negative dims count from the end, and a dim out of
range raises IndexError; a shape that does not fit raises RuntimeError.
"""
import math
import warnings

import numpy as np

from .._args import canonical_dim, shape_arg
from ..autograd import Function
from ..backend import xp_of
from ._util import unbroadcast


def infer_shape(shape, numel):
    """``shape`` with its one -1 filled in; RuntimeError when it cannot hold
    ``numel`` elements (PyTorch's message)."""
    known = math.prod(n for n in shape if n != -1)
    holes = sum(n == -1 for n in shape)
    bad = (holes > 1 or any(n < -1 for n in shape)
           or (numel != known if holes == 0 else known == 0 or numel % known))
    if bad:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
    return tuple(numel // known if n == -1 else n for n in shape)


class Reshape(Function):
    def forward(self, a, shape):
        self.shape = a.shape
        return a.reshape(shape)

    def backward(self, g):
        return g.reshape(self.shape)


class Permute(Function):
    def forward(self, a, dims):
        self.inverse = tuple(int(i) for i in np.argsort(dims))
        return a.transpose(dims)

    def backward(self, g):
        return g.transpose(self.inverse)


class Expand(Function):
    """Broadcast to a larger shape (a read-only view); backward sums back."""

    def forward(self, a, shape):
        self.shape = a.shape
        return xp_of(a).broadcast_to(a, shape)

    def backward(self, g):
        return unbroadcast(g, self.shape)


class Repeat(Function):
    """Tile: the input repeated ``reps[i]`` times along dim i."""

    def forward(self, a, reps):
        self.shape, self.reps = a.shape, reps
        padded = (1,) * (len(reps) - a.ndim) + a.shape
        return xp_of(a).tile(a.reshape(padded), reps)

    def backward(self, g):
        padded = (1,) * (len(self.reps) - len(self.shape)) + self.shape
        split = [n for pair in zip(self.reps, padded) for n in pair]
        return g.reshape(split).sum(axis=tuple(range(0, len(split), 2))).reshape(self.shape)


class Contiguous(Function):
    def forward(self, a):
        return xp_of(a).ascontiguousarray(a)

    def backward(self, g):
        return g


def reshape(a, *shape):
    """``a`` with a new shape (one dim may be -1); copies only where the
    memory layout needs it."""
    return Reshape.apply(a, shape=infer_shape(shape_arg(shape), a.array.size))


def view(a, *shape):
    """PyTorch's ``view``: here a reshape, so a view that is valid in PyTorch
    never fails (it may copy where NumPy's layout differs; docs/PYTORCH.md).
    ``view(dtype)`` reinterprets the bytes, outside the graph."""
    if len(shape) == 1 and not isinstance(shape[0], (tuple, list, int, np.integer)):
        if a.requires_grad:
            raise RuntimeError("view(dtype) of a tensor that requires grad is not supported")
        return type(a)(a.array.view(shape[0]))
    return Reshape.apply(a, shape=infer_shape(shape_arg(shape), a.array.size))


def view_as(a, other):
    return view(a, other.shape)


def reshape_as(a, other):
    return reshape(a, other.shape)


def permute(a, *dims):
    """The dims of ``a`` reordered: output dim i is input dim ``dims[i]``."""
    dims = shape_arg(dims)
    if len(dims) != a.ndim:
        raise RuntimeError(f"permute(): number of dims does not match: input.dim() = "
                           f"{a.ndim} is not equal to len(dims) = {len(dims)}")
    dims = tuple(canonical_dim(d, a.ndim) for d in dims)
    if len(set(dims)) != len(dims):
        raise RuntimeError(f"permute(): duplicate dims are not allowed, got {dims}")
    return Permute.apply(a, dims=dims)


def transpose(a, dim0, dim1):
    """``a`` with dims ``dim0`` and ``dim1`` swapped (PyTorch; NumPy's
    permutation form is ``permute``)."""
    dims = list(range(a.ndim))
    d0, d1 = canonical_dim(dim0, a.ndim), canonical_dim(dim1, a.ndim)
    if a.ndim == 0:
        return Permute.apply(a, dims=())
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return Permute.apply(a, dims=tuple(dims))


def t(a):
    """PyTorch's ``t()``: transpose of a matrix; 0-d and 1-d come back as is."""
    if a.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {a.ndim}D")
    return transpose(a, 0, 1) if a.ndim == 2 else Permute.apply(a, dims=tuple(range(a.ndim)))


def T(a):  # noqa: N802 - PyTorch's property name
    """``a.T``: the matrix transpose; other ranks reverse their dims, with
    PyTorch's deprecation warning (0-d: silently itself)."""
    if a.ndim not in (0, 2):
        warnings.warn("The use of `x.T` on tensors of dimension other than 2 to reverse their "
                      "shape is deprecated (PyTorch); use `x.mT` to transpose batches of "
                      "matrices or `x.permute(*reversed(range(x.ndim)))`.",
                      UserWarning, stacklevel=2)
    return Permute.apply(a, dims=tuple(reversed(range(a.ndim))))


def mT(a):  # noqa: N802 - PyTorch's property name
    """``a.mT``: the last two dims swapped (batches of matrices)."""
    if a.ndim < 2:
        raise RuntimeError(f"tensor.mT is only supported on matrices or batches of matrices. "
                           f"Got {a.ndim}-D tensor.")
    return transpose(a, -2, -1)


def flatten(a, start_dim=0, end_dim=-1):
    """Dims ``start_dim..end_dim`` (inclusive) merged into one."""
    if a.ndim == 0:
        return Reshape.apply(a, shape=(1,))
    s, e = canonical_dim(start_dim, a.ndim), canonical_dim(end_dim, a.ndim)
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    shape = a.shape[:s] + (math.prod(a.shape[s:e + 1]),) + a.shape[e + 1:]
    return Reshape.apply(a, shape=shape)


def unflatten(a, dim, sizes):
    """Dim ``dim`` split into ``sizes`` (one may be -1)."""
    d = canonical_dim(dim, a.ndim)
    sizes = infer_shape(tuple(int(n) for n in sizes), a.shape[d])
    return Reshape.apply(a, shape=a.shape[:d] + sizes + a.shape[d + 1:])


def unsqueeze(a, dim):
    """A size-1 dim inserted at ``dim`` (in ``[-ndim-1, ndim]``)."""
    d = canonical_dim(dim, a.ndim + 1)
    return Reshape.apply(a, shape=a.shape[:d] + (1,) + a.shape[d:])


def squeeze(a, dim=None):
    """Size-1 dims removed: all of them, or those named by ``dim`` (an int
    or a tuple); a named dim whose size is not 1 stays (a no-op, as PyTorch)."""
    if dim is None:
        drop = {i for i, n in enumerate(a.shape) if n == 1}
    else:
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        drop = {d for d in (canonical_dim(x, a.ndim) for x in dims)
                if a.ndim and a.shape[d] == 1}
    return Reshape.apply(a, shape=tuple(n for i, n in enumerate(a.shape) if i not in drop))


def expand(a, *sizes):
    """``a`` broadcast to ``sizes`` without copying; -1 keeps a dim; new
    dims go in front."""
    sizes = shape_arg(sizes)
    lead = len(sizes) - a.ndim
    if lead < 0:
        raise RuntimeError(f"expand: the number of sizes provided ({len(sizes)}) must be "
                           f"greater or equal to the number of dimensions in the tensor "
                           f"({a.ndim})")
    shape = []
    for i, n in enumerate(sizes):
        old = a.shape[i - lead] if i >= lead else None
        if n == -1 and old is None:
            raise RuntimeError(f"expand: -1 is not allowed in a leading, non-existing "
                               f"dimension {i}")
        n = old if n == -1 else n
        if old is not None and old != n and old != 1:
            raise RuntimeError(f"The expanded size of the tensor ({n}) must match the existing "
                               f"size ({old}) at non-singleton dimension {i}.  Target sizes: "
                               f"{list(sizes)}.  Tensor sizes: {list(a.shape)}")
        shape.append(n)
    return Expand.apply(a, shape=tuple(shape))


def expand_as(a, other):
    return expand(a, other.shape)


def repeat(a, *sizes):
    """``a`` tiled ``sizes[i]`` times along dim i (PyTorch's ``repeat``,
    NumPy's ``tile``; extra sizes add leading dims)."""
    sizes = shape_arg(sizes)
    if len(sizes) < a.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than "
                           f"number of dimensions of tensor ({len(sizes)} < {a.ndim})")
    return Repeat.apply(a, reps=sizes)


def contiguous(a):
    """``a`` itself when its array is C-contiguous, else a contiguous copy."""
    return a if a.array.flags.c_contiguous else Contiguous.apply(a)
