"""More elementwise functions with PyTorch's names: ``square``, the step
functions ``sign``, ``floor``, ``ceil``, ``round(decimals=0)`` and ``trunc``
(their gradient is zero everywhere, as PyTorch's), ``lerp``, and the small
products ``outer`` and ``addmm`` (built from existing ops, so their
gradients are those ops' gradients).

``round`` rounds half to even (``round(2.5) == 2``, ``round(-0.5) == -0``),
as PyTorch; with ``decimals`` it is ``round(x * 10**d) / 10**d``, as
PyTorch's. On integer tensors the step functions return a copy, as PyTorch.
"""
from .._tensor import Tensor
from ..autograd import Function
from ..backend import xp_of
from .arith import add, mul, promote, sub
from .linalg import matmul


class Square(Function):
    def forward(self, a):
        self.a = a
        return a * a

    def backward(self, g):
        return g * (2 * self.a)


class Step(Function):
    """A piecewise-constant function (``name``: an xp function): the gradient
    is zero, as PyTorch gives for sign, floor, ceil, round and trunc."""

    def forward(self, a, name, decimals=0):
        xp = xp_of(a)
        if a.dtype.kind in "biu" and name != "sign":
            return a.copy()
        if name == "round" and decimals:
            scale = 10.0 ** decimals
            return (xp.round(a * scale) / scale).astype(a.dtype, copy=False)
        return getattr(xp, name)(a)

    def backward(self, g):
        return xp_of(g).zeros_like(g)


def square(input):  # noqa: A002 - PyTorch's argument name
    """input * input (bool input gives int64, as PyTorch)."""
    if input.array.dtype.kind == "b":
        input = Tensor(input.array.astype("int64"))
    return Square.apply(input)


def _step(name):
    def step(input):  # noqa: A002
        return Step.apply(input, name=name)
    step.__name__ = name
    step.__doc__ = f"PyTorch's ``{name}``; zero gradient."
    return step


sign, floor, ceil, trunc = (_step(n) for n in ("sign", "floor", "ceil", "trunc"))


def round(input, decimals=0):  # noqa: A001,A002 - PyTorch's names
    """Round half to even, to ``decimals`` places; zero gradient."""
    return Step.apply(input, name="round", decimals=int(decimals))


def lerp(input, end, weight):  # noqa: A002
    """``input + weight * (end - input)``; ``weight`` a number or a tensor."""
    return add(input, mul(weight, sub(end, input)))


def outer(input, vec2):  # noqa: A002
    """The outer product of two 1-D tensors, ``(n, m)``."""
    if input.ndim != 1 or vec2.ndim != 1:
        raise RuntimeError(f"outer: expected 1-D tensors, got shapes {tuple(input.shape)} "
                           f"and {tuple(vec2.shape)}")
    a, b = promote(input, vec2)
    return mul(a.reshape(-1, 1), b.reshape(1, -1))


def addmm(input, mat1, mat2, *, beta=1, alpha=1):  # noqa: A002
    """``beta * input + alpha * (mat1 @ mat2)`` for 2-D ``mat1`` and ``mat2``
    (``input`` broadcasts to the product); ``beta=0`` ignores ``input``
    (NaN there does not propagate), as PyTorch."""
    if mat1.ndim != 2 or mat2.ndim != 2:
        raise RuntimeError(f"addmm: mat1 and mat2 must be matrices, got shapes "
                           f"{tuple(mat1.shape)} and {tuple(mat2.shape)}")
    out = matmul(mat1, mat2)
    if alpha != 1:
        out = mul(out, alpha)
    if beta == 0:
        return out
    return add(out, input if beta == 1 else mul(input, beta))
