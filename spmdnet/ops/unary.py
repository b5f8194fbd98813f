"""Elementwise functions: exp, log, log1p, sqrt, rsqrt, sin, cos, abs, clamp,
tanh, sigmoid, relu, gelu. Integer inputs to the floating functions give the
default float dtype, as PyTorch's.

relu, gelu, tanh and sigmoid are activations: their plain-xp math is written
once, in ``act_forward`` and ``act_backward`` (the reference of the kernels
in ``spmdnet.kernels.activation``), for these ops and for the fused linear
layer (``ops.linalg.LinearAct``). The ops take kernels where
``kernels.lookup`` gives one (its table: where they measured at least 2x
faster); both sides save the same things, so they mix freely. The xp path
calls no Numba code (``kernels.erf`` is plain xp). Complex inputs take the
conjugate derivative (PyTorch's convention, ``ops/complex.py``).
"""
import math

import numpy as np

from .. import kernels
from .._tensor import Tensor, get_default_dtype
from ..autograd import Function
from ..backend import xp_of
from ..kernels import erf
from .complex import conj_if_complex as conj


def _ieee():
    """NumPy's warnings off for IEEE results PyTorch gives silently (log(0)
    is -inf, sqrt(-1) nan, x/0 inf): a NumPy habit must not add noise to a
    PyTorch program. CuPy never warns."""
    return np.errstate(divide="ignore", invalid="ignore")


class Exp(Function):
    def forward(self, a):
        self.out = xp_of(a).exp(a)
        return self.out

    def backward(self, g):
        return g * conj(self.out)


class Log(Function):
    def forward(self, a):
        self.a = a
        with _ieee():  # log(0) = -inf, log(-1) = nan: silently, as PyTorch
            return xp_of(a).log(a)

    def backward(self, g):
        with _ieee():
            return g / conj(self.a)


class Log1p(Function):
    def forward(self, a):
        self.a = a
        with _ieee():
            return xp_of(a).log1p(a)

    def backward(self, g):
        with _ieee():
            return g / conj(1 + self.a)


class Sqrt(Function):
    def forward(self, a):
        with _ieee():  # sqrt(-1) = nan, silently
            self.out = xp_of(a).sqrt(a)
        return self.out

    def backward(self, g):
        with _ieee():
            return g / (2 * conj(self.out))


class Rsqrt(Function):
    def forward(self, a):
        self.out = 1 / xp_of(a).sqrt(a)
        return self.out

    def backward(self, g):
        return g * -0.5 * conj(self.out ** 3)


class Sin(Function):
    def forward(self, a):
        self.a = a
        return xp_of(a).sin(a)

    def backward(self, g):
        return g * conj(xp_of(g).cos(self.a))


class Cos(Function):
    def forward(self, a):
        self.a = a
        return xp_of(a).cos(a)

    def backward(self, g):
        return g * -conj(xp_of(g).sin(self.a))


class Abs(Function):
    def forward(self, a):
        self.a = a
        return xp_of(a).abs(a)

    def backward(self, g):
        a = self.a
        if a.dtype.kind != "c":
            return g * xp_of(g).sign(a)
        # PyTorch's sgn(z) = z/|z| (0 at 0): for real L the gradient of z
        xp, size = xp_of(a), xp_of(a).abs(a)
        return g * xp.where(size == 0, 0, a / xp.where(size == 0, 1, size))


class Clamp(Function):
    """a clipped to [lo, hi] (Python scalars, either None); the gradient
    passes where lo <= a <= hi, as PyTorch's. lo > hi gives hi everywhere."""

    def forward(self, a, lo=None, hi=None):
        self.a, self.lo, self.hi = a, lo, hi
        out = a if lo is None else xp_of(a).maximum(a, lo)
        return out if hi is None else xp_of(a).minimum(out, hi)

    def backward(self, g):
        keep = True
        if self.lo is not None:
            keep = self.a >= self.lo
        if self.hi is not None:
            keep = keep & (self.a <= self.hi)
        return g * keep


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def act_forward(name, a):
    """``(out, saved)``: activation ``name`` of a, and what ``act_backward``
    needs. relu is max(a, 0); gelu is a·Φ(a), exact (erf) or PyTorch's tanh
    approximation ("gelu_tanh"); sigmoid is 0.5·(1 + tanh(a/2)), which never
    overflows, unlike 1 / (1 + exp(-a))."""
    xp = xp_of(a)
    if name == "relu":
        # a where a >= 0 or NaN, else 0: -0.0 and NaN pass as PyTorch's (maximum
        # turns -0.0 into +0.0); the zero is a's dtype, so nothing upcasts
        out = xp.where(a < 0, a.dtype.type(0), a)
        return out, out
    if name == "tanh":
        out = xp.tanh(a)
        return out, out
    if name == "sigmoid":
        out = 0.5 * (1 + xp.tanh(0.5 * a))
        return out, out
    if name == "gelu_tanh":
        t = xp.tanh(_SQRT_2_OVER_PI * (a + 0.044715 * a ** 3))
        return 0.5 * a * (1 + t), (a, t)
    assert name == "gelu", name
    cdf = 0.5 * (1 + erf(a * _INV_SQRT_2))
    return a * cdf, (a, cdf)


def act_backward(name, g, saved):
    """The gradient before activation ``name``, given ``act_forward``'s saved."""
    if name == "relu":
        # select, not multiply: 0 where dead even when g is inf or NaN; g at a NaN output
        return xp_of(g).where(saved <= 0, g.dtype.type(0), g)
    if name == "tanh":
        return g * (1 - saved * saved)
    if name == "sigmoid":
        return g * saved * (1 - saved)
    a, aux = saved
    if name == "gelu_tanh":
        dt = (1 - aux * aux) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * a * a)
        return g * (0.5 * (1 + aux) + 0.5 * a * dt)
    pdf = _INV_SQRT_2PI * xp_of(a).exp(-0.5 * a * a)
    return g * (aux + a * pdf)


class _Activation(Function):
    """One activation; kernels where ``kernels.lookup`` gives them (forward
    decides for backward too)."""

    name = None

    def forward(self, a):
        kernel = kernels.lookup(self.name, a)
        self.backward_kernel = kernels.lookup(self.name, a, step="backward")
        out, self.saved = kernel(a) if kernel else act_forward(self.name, a)
        return out

    def backward(self, g):
        if self.backward_kernel is not None:
            return self.backward_kernel(g, self.saved)[0]
        return act_backward(self.name, g, self.saved)


class ReLU(_Activation):
    name = "relu"


class Tanh(_Activation):
    name = "tanh"


class Sigmoid(_Activation):
    name = "sigmoid"


class GELU(_Activation):
    """x·Φ(x), exact (erf) or PyTorch's tanh approximation."""

    def forward(self, a, approximate="none"):
        self.name = "gelu_tanh" if approximate == "tanh" else "gelu"
        return super().forward(a)


def _floating(t):
    """t, cast to the default float dtype when it holds integers or bools."""
    if t.array.dtype.kind in "fcV":  # "V": bfloat16 (dtypes.py)
        return t
    return Tensor(t.array.astype(get_default_dtype()))


def _unary(cls):
    def op(input):  # noqa: A002 - PyTorch's argument name
        return cls.apply(_floating(input))
    op.__name__ = cls.__name__.lower()
    return op


exp, log, log1p, sqrt, rsqrt, sin, cos, tanh, sigmoid = (
    _unary(c) for c in (Exp, Log, Log1p, Sqrt, Rsqrt, Sin, Cos, Tanh, Sigmoid))


def relu(input):  # noqa: A002
    return ReLU.apply(input)


def abs(input):  # noqa: A001,A002 - PyTorch's name
    return Abs.apply(input)
