"""Scans and reorderings along dims: ``cumsum``, ``cumprod``, ``flip``,
``roll``, with PyTorch's names and semantics.

``cumsum`` / ``cumprod`` of bool or integer tensors give int64, as PyTorch
(``dtype=`` casts first). ``cumprod``'s gradient is exact where the input
holds zeros too (a slower path, taken only then).
"""
import numpy as np

from ..autograd import Function
from ..backend import xp_of
from .convert import cast
from .._args import canonical_dim


def _reverse_cumsum(g, axis):
    xp = xp_of(g)
    return xp.flip(xp.cumsum(xp.flip(g, axis), axis=axis), axis)


class Cumsum(Function):
    def forward(self, a, axis):
        self.axis = axis
        return xp_of(a).cumsum(a, axis=axis)

    def backward(self, g):
        return _reverse_cumsum(g, self.axis)


class Cumprod(Function):
    def forward(self, a, axis):
        self.a, self.axis = a, axis
        self.out = xp_of(a).cumprod(a, axis=axis)
        return self.out

    def backward(self, g):
        xp, a = xp_of(g), self.a
        if not (a == 0).any():
            return _reverse_cumsum(g * self.out, self.axis) / a
        # with zeros: dout_j/da_i = prod(a[:i]) * prod(a[i+1:j+1]) for j >= i
        a, g = xp.moveaxis(a, self.axis, 0), xp.moveaxis(g, self.axis, 0)
        before = xp.concatenate([xp.ones_like(a[:1]), xp.cumprod(a[:-1], axis=0)])
        out = xp.empty_like(a)
        for i in range(a.shape[0]):
            after = xp.cumprod(a[i + 1:], axis=0)
            out[i] = before[i] * (g[i] + (g[i + 1:] * after).sum(axis=0))
        return xp.moveaxis(out, 0, self.axis)


def _scan(cls, input, dim, dtype):  # noqa: A002
    if dtype is not None:
        input = cast(input, dtype)
    elif input.array.dtype.kind in "biu":
        input = cast(input, np.int64)
    return cls.apply(input, axis=canonical_dim(dim, input.ndim) if input.ndim else None)


def cumsum(input, dim, *, dtype=None):  # noqa: A002 - PyTorch's argument names
    """Running sums along ``dim``."""
    out = _scan(Cumsum, input, dim, dtype)
    return out.reshape(input.shape) if input.ndim == 0 else out


def cumprod(input, dim, *, dtype=None):  # noqa: A002
    """Running products along ``dim``."""
    out = _scan(Cumprod, input, dim, dtype)
    return out.reshape(input.shape) if input.ndim == 0 else out


class Flip(Function):
    def forward(self, a, axes):
        self.axes = axes
        return xp_of(a).flip(a, axes).copy()

    def backward(self, g):
        return xp_of(g).flip(g, self.axes)


class Roll(Function):
    def forward(self, a, shifts, axes):
        self.shifts, self.axes = shifts, axes
        return xp_of(a).roll(a, shifts, axis=axes)

    def backward(self, g):
        back = tuple(-s for s in self.shifts) if isinstance(self.shifts, tuple) else -self.shifts
        return xp_of(g).roll(g, back, axis=self.axes)


def _dims(dims, ndim):
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    out = tuple(canonical_dim(d, ndim) for d in dims)
    if len(set(out)) != len(out):
        raise RuntimeError(f"dims has duplicates: {list(dims)}")
    return out


def flip(input, dims):  # noqa: A002
    """A copy with the order of ``dims`` (an int or a sequence) reversed."""
    return Flip.apply(input, axes=_dims(dims, input.ndim))


def roll(input, shifts, dims=None):  # noqa: A002
    """Elements shifted by ``shifts`` along ``dims`` (wrapping around);
    without ``dims`` the flattened tensor is rolled and reshaped back."""
    if dims is None:
        if not isinstance(shifts, int) and len(shifts) != 1:
            raise RuntimeError(f"roll: shifts {shifts} need dims")
        shift = shifts if isinstance(shifts, int) else int(shifts[0])
        return Roll.apply(input, shifts=shift, axes=None)
    many = not isinstance(shifts, int) or not isinstance(dims, int)
    shifts = (shifts,) if isinstance(shifts, int) else tuple(int(s) for s in shifts)
    axes = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(axes):
        raise RuntimeError(f"roll: shifts and dimensions must align. shifts: {len(shifts)}, "
                           f"dims: {len(axes)}")
    axes = tuple(canonical_dim(d, input.ndim) for d in axes)
    return Roll.apply(input, shifts=shifts if many else shifts[0],
                      axes=axes if many else axes[0])
