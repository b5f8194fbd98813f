"""Comparisons, logical operators and value tests: bool (or integer, for
``&``/``|``/``^`` on integers) tensors outside the graph, as PyTorch's."""
import operator

from .._tensor import Tensor
from ..backend import xp_of


def _plain(x):
    return x.array if isinstance(x, Tensor) else x


def _binary(name, op):
    def compare(input, other):  # noqa: A002 - PyTorch's argument name
        a, b = _plain(input), _plain(other)
        xp_of(a, b)  # NumPy with CuPy raises TypeError naming both
        return Tensor(op(a, b))
    compare.__name__ = name
    return compare


eq, ne = _binary("eq", operator.eq), _binary("ne", operator.ne)
lt, le = _binary("lt", operator.lt), _binary("le", operator.le)
gt, ge = _binary("gt", operator.gt), _binary("ge", operator.ge)
bitwise_and, bitwise_or = _binary("bitwise_and", operator.and_), _binary("bitwise_or", operator.or_)
bitwise_xor = _binary("bitwise_xor", operator.xor)


def bitwise_not(input):  # noqa: A002
    """``~x``: logical not on bool tensors, bitwise on integers."""
    if input.dtype.kind not in "biu":
        raise TypeError(f"~ (bitwise_not) is only for bool and integer tensors, got {input.dtype}")
    return Tensor(~input.array)


def _logical(name, fn):
    def logical(input, other):  # noqa: A002
        a, b = _plain(input), _plain(other)
        return Tensor(getattr(xp_of(a, b), fn)(a, b))
    logical.__name__ = name
    return logical


logical_and = _logical("logical_and", "logical_and")
logical_or = _logical("logical_or", "logical_or")
logical_xor = _logical("logical_xor", "logical_xor")


def _test(name):
    def test(input):  # noqa: A002
        return Tensor(getattr(xp_of(input.array), name)(input.array))
    test.__name__ = name
    return test


isfinite, isnan, isinf, logical_not = (
    _test(n) for n in ("isfinite", "isnan", "isinf", "logical_not"))


def equal(input, other):  # noqa: A002
    """True when both have the same shape and elements (a Python bool)."""
    return input.shape == other.shape and bool((input.array == other.array).all())
