"""Elementwise selection: where, masked_fill, maximum / minimum, clamp.

Operands are promoted with PyTorch's rules (``arith.promote``); gradients
follow PyTorch's: ``where`` routes the gradient to the chosen side, ties of
``maximum``/``minimum`` split it evenly, ``clamp`` passes it where
min <= x <= max.
"""
from .._tensor import Tensor, _as_array
from ..autograd import Function
from ..backend import xp_of
from ._util import unbroadcast
from .arith import _SCALARS, cast, promote
from .unary import Clamp


class Where(Function):
    """cond ? a : b with broadcasting; cond (bool) gets no gradient."""

    def forward(self, cond, a, b):
        self.cond, self.shapes = cond, (a.shape, b.shape)
        return xp_of(cond, a, b).where(cond, a, b)

    def backward(self, g):
        _, need_a, need_b = self.needs_input_grad
        xp = xp_of(g)
        zero = xp.zeros((), g.dtype)
        return (None,
                unbroadcast(xp.where(self.cond, g, zero), self.shapes[0]) if need_a else None,
                unbroadcast(xp.where(self.cond, zero, g), self.shapes[1]) if need_b else None)


class MaskedFill(Function):
    """input with the 0-d ``value`` where ``mask`` (broadcast to input's
    shape) holds: a copy and one masked write, 1.6x faster than ``where``
    with a broadcast mask (the causal mask of attention scores)."""

    def forward(self, x, mask, value):
        self.mask = mask
        out = x.copy()
        xp_of(x).copyto(out, value, where=mask)
        return out

    def backward(self, g):
        need_x, _, need_value = self.needs_input_grad
        xp = xp_of(g)
        gx = gv = None
        if need_x:  # exact zeros where filled, whatever g holds there (inf, NaN)
            gx = g.copy()
            xp.copyto(gx, xp.zeros((), g.dtype), where=self.mask)
        if need_value:
            gv = xp.where(self.mask, g, xp.zeros((), g.dtype)).sum()
        return gx, None, gv


class _Extremum(Function):
    """Elementwise maximum (``sign`` 1) or minimum (-1); ties share the
    gradient evenly, as PyTorch's."""

    sign = 1

    def forward(self, a, b):
        self.a, self.b = a, b
        xp = xp_of(a, b)
        return xp.maximum(a, b) if self.sign > 0 else xp.minimum(a, b)

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        a, b = (self.a, self.b) if self.sign > 0 else (self.b, self.a)
        half = g * (a == b) * 0.5
        return (unbroadcast(g * (a > b) + half, self.a.shape) if need_a else None,
                unbroadcast(g * (a < b) + half, self.b.shape) if need_b else None)


class Maximum(_Extremum):
    sign = 1


class Minimum(_Extremum):
    sign = -1


def _condition(name, cond):
    cond = cond if isinstance(cond, Tensor) else Tensor(_as_array(cond))
    if cond.array.dtype.kind != "b":
        raise RuntimeError(f"{name}: expected a bool condition/mask tensor, "
                           f"got dtype {cond.array.dtype}")
    return cond


def where(condition, input, other):  # noqa: A002 - PyTorch's argument names
    """Elements of ``input`` where ``condition`` holds, else of ``other``."""
    cond = _condition("where", condition)
    a, b = promote(input, other)
    xp_of(cond.array, a.array, b.array)
    return Where.apply(cond, a, b)


def masked_fill(input, mask, value):  # noqa: A002
    """``input`` with ``value`` where ``mask`` holds; keeps input's dtype."""
    mask = _condition("masked_fill", mask)
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError("masked_fill only supports a 0-dimensional value tensor, "
                               f"got shape {value.shape}")
        value = cast(value, input.dtype)
    else:
        value = Tensor(xp_of(input.array).asarray(value, dtype=input.dtype))
    xp_of(mask.array, input.array)  # NumPy with CuPy raises TypeError naming both
    if all(m in (1, n) for m, n in zip(mask.shape[::-1], input.shape[::-1])) \
            and mask.ndim <= input.ndim:
        return MaskedFill.apply(input, mask, value)
    return Where.apply(mask, value, input)  # a mask larger than input: broadcast both


def maximum(input, other):  # noqa: A002
    return Maximum.apply(*promote(input, other))


def minimum(input, other):  # noqa: A002
    return Minimum.apply(*promote(input, other))


def clamp(input, min=None, max=None):  # noqa: A002 - PyTorch's argument names
    """``input`` clipped to [min, max], either None; bounds are Python
    scalars or tensors (tensor bounds get gradients where they are chosen)."""
    if min is None and max is None:
        raise RuntimeError("clamp: at least one of 'min' or 'max' must not be None")
    bounds = [b for b in (min, max) if b is not None]
    if all(isinstance(b, _SCALARS) for b in bounds):
        x = promote(input, *bounds)[0]
        return Clamp.apply(x, lo=min, hi=max)
    out = input
    if min is not None:
        out = where(out < min, min, out)
    if max is not None:
        out = where(out > max, max, out)
    return out


clip = clamp
