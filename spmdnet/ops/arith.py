"""Elementwise arithmetic with broadcasting and PyTorch's type promotion:
add, sub, mul, div, neg, pow. Complex operands differentiate as PyTorch's
(the conjugate of the derivative: ``ops/complex.py``)."""
import numpy as np

from .._args import scalar_dtype
from .._tensor import Tensor, _as_array, get_default_dtype
from ..autograd import Function
from ..backend import xp_of
from ._util import result_type, unbroadcast
from .complex import conj_if_complex as conj


class Add(Function):
    def forward(self, a, b):
        self.shapes = a.shape, b.shape
        return a + b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        return (unbroadcast(g, self.shapes[0]) if need_a else None,
                unbroadcast(g, self.shapes[1]) if need_b else None)


class Sub(Function):
    def forward(self, a, b):
        self.shapes = a.shape, b.shape
        return a - b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        return (unbroadcast(g, self.shapes[0]) if need_a else None,
                unbroadcast(-g, self.shapes[1]) if need_b else None)


class Mul(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return a * b

    def backward(self, g):  # complex: the conjugate (PyTorch's convention, ops/complex.py)
        need_a, need_b = self.needs_input_grad
        return (unbroadcast(g * conj(self.b), self.a.shape) if need_a else None,
                unbroadcast(g * conj(self.a), self.b.shape) if need_b else None)


class Div(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return a / b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        ga = g / conj(self.b)
        return (unbroadcast(ga, self.a.shape) if need_a else None,
                unbroadcast(-ga * conj(self.a / self.b), self.b.shape) if need_b else None)


class Neg(Function):
    def forward(self, a):
        return -a

    def backward(self, g):
        return -g


class Pow(Function):
    """a ** b; a constant exponent is a tensor that needs no gradient. The
    gradients are PyTorch's at the edges: exponent 0 gives a zero base
    gradient (not 0 * inf at a == 0); the exponent's gradient is 0 where
    a == 0 and b >= 0 and NaN for a negative base (log a)."""

    def forward(self, a, b):
        self.a, self.b = a, b
        with np.errstate(divide="ignore", invalid="ignore"):  # 0 ** -1 is inf, silently
            self.out = a ** b
        return self.out

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        xp = xp_of(self.a, self.b)
        ga = gb = None
        with np.errstate(divide="ignore", invalid="ignore"):  # 0 ** -1, log(-1): as PyTorch
            if need_a:
                d = xp.where(self.b == 0, 0, self.b * self.a ** (self.b - 1))
                ga = unbroadcast(g * conj(d), self.a.shape)
            if need_b:
                b_real = self.b.real if self.b.dtype.kind == "c" else self.b
                d = xp.where((self.a == 0) & (b_real >= 0), 0, self.out * xp.log(self.a))
                gb = unbroadcast(g * conj(d), self.b.shape)
        return ga, gb


class Cast(Function):
    """a as ``dtype``; the gradient goes back in a's dtype (``ops.convert``
    builds ``to``/``float()``/... on it)."""

    def forward(self, a, dtype):
        self.dtype = a.dtype
        return a.astype(dtype)

    def backward(self, g):  # complex to real: the real part (PyTorch's)
        if g.dtype.kind == "c" and self.dtype.kind != "c":
            g = g.real
        return g.astype(self.dtype, copy=False)


def cast(t, dtype):
    """Tensor t as ``dtype`` for promotion (t itself when it has it)."""
    return t if t.array.dtype == dtype else Cast.apply(t, dtype=dtype)


_SCALARS = (bool, int, float, complex, np.generic)


def as_tensor_like(x, like):
    """x as a Tensor; Python scalars take ``like``'s dtype (no upcasting)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, _SCALARS):
        return Tensor(xp_of(like.array).asarray(x, dtype=like.dtype))
    return Tensor(_as_array(x))


def promote(*operands):
    """The operands (tensors, arrays, Python scalars) as tensors of one
    dtype, PyTorch's ``torch.result_type``: a float32 tensor with an int64
    tensor or a Python float stays float32, an int tensor with a Python float
    takes the default float dtype, float32 with a float64 tensor is float64,
    and 0-dim tensors count only when of a higher category."""
    dims, zeros, scalars, ts = [], [], [], []
    for x in operands:
        if isinstance(x, _SCALARS):
            scalars.append(scalar_dtype(x, get_default_dtype()))
        else:
            x = x if isinstance(x, Tensor) else Tensor(_as_array(x))
            (dims if x.array.ndim else zeros).append(x.array.dtype)
        ts.append(x)
    dtype = result_type(dims, zeros, scalars)
    xp = xp_of(*[t.array for t in ts if isinstance(t, Tensor)])
    return [cast(t, dtype) if isinstance(t, Tensor) else Tensor(xp.asarray(t, dtype=dtype))
            for t in ts]


def _binary(cls, a, b):
    if not (isinstance(a, Tensor) and isinstance(b, Tensor) and a.array.dtype == b.array.dtype):
        a, b = promote(a, b)
    xp_of(a.array, b.array)  # NumPy with CuPy raises TypeError naming both
    try:
        return cls.apply(a, b)
    except ValueError as exc:
        if "broadcast" not in str(exc):
            raise
        raise ValueError(f"{cls.__name__.lower()}: shapes {a.shape} and {b.shape} "
                         "cannot be broadcast together") from None


def _scaled(other, alpha):
    if alpha == 1:
        return other
    return other * alpha if isinstance(other, _SCALARS) else mul(other, alpha)


def add(input, other, *, alpha=1):  # noqa: A002 - PyTorch's argument name
    return _binary(Add, input, _scaled(other, alpha))


def sub(input, other, *, alpha=1):  # noqa: A002
    return _binary(Sub, input, _scaled(other, alpha))


def mul(input, other):  # noqa: A002
    return _binary(Mul, input, other)


def div(input, other):  # noqa: A002
    """True division: integer operands give the default float dtype."""
    a, b = promote(input, other)
    if a.array.dtype.kind not in "fcV":  # "V": bfloat16 (dtypes.py)
        a, b = cast(a, get_default_dtype()), cast(b, get_default_dtype())
    return _binary(Div, a, b)


def pow(input, exponent):  # noqa: A001,A002 - the operator's name
    """``input ** exponent``; either may be a Python number (not both, as
    PyTorch), with gradients for both tensors."""
    if isinstance(input, _SCALARS) and isinstance(exponent, _SCALARS):
        raise TypeError(f"pow() received an invalid combination of arguments: two numbers "
                        f"({input!r}, {exponent!r}); one of them must be a Tensor")
    return _binary(Pow, input, exponent)


def neg(input):  # noqa: A002
    return Neg.apply(input)


def rsub(a, b):
    return sub(b, a)


def rdiv(a, b):
    return div(b, a)


def rpow(a, b):
    return pow(b, a)
