"""The op registry: every differentiable op, the wrappers that turn Python
arguments into tensors, and the table binding operators and methods onto
Tensor. Grep here to find any op.
"""
import operator

from ..backend import xp_of
from .._tensor import Tensor, _as_array
from .arith import Add, Div, Mul, Neg, Pow, Sub
from .linalg import Linear, LinearAct, MatMul
from .nn_ops import CrossEntropy, Dropout, Embedding, LayerNorm, LogSoftmax, MSELoss, Softmax
from .reduce import Max, Mean, Sum
from .shape import Concatenate, Index, Reshape, Stack, Transpose
from .unary import GELU, Exp, Log, ReLU, Sigmoid, Sqrt, Tanh

REGISTRY = {
    "add": Add, "sub": Sub, "mul": Mul, "div": Div, "neg": Neg, "pow": Pow,
    "matmul": MatMul, "linear": Linear, "linear_act": LinearAct,
    "exp": Exp, "log": Log, "sqrt": Sqrt, "tanh": Tanh, "sigmoid": Sigmoid,
    "relu": ReLU, "gelu": GELU,
    "sum": Sum, "mean": Mean, "max": Max,
    "reshape": Reshape, "transpose": Transpose, "index": Index,
    "concatenate": Concatenate, "stack": Stack,
    "softmax": Softmax, "log_softmax": LogSoftmax, "cross_entropy": CrossEntropy,
    "mse_loss": MSELoss, "dropout": Dropout, "layer_norm": LayerNorm,
    "embedding": Embedding,
}


def as_tensor_like(x, like):
    """x as a Tensor; Python scalars take ``like``'s dtype (no upcasting)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (int, float, bool)):
        return Tensor(_as_array(x, like.dtype))
    return Tensor(_as_array(x))


def _binary(cls, a, b):
    a = as_tensor_like(a, b) if isinstance(b, Tensor) else as_tensor_like(a, a)
    b = as_tensor_like(b, a)
    xp_of(a.data, b.data)  # NumPy with CuPy raises TypeError naming both
    try:
        return cls.apply(a, b)
    except ValueError as exc:
        if "broadcast" not in str(exc):
            raise
        raise ValueError(f"{cls.__name__.lower()}: shapes {a.shape} and {b.shape} "
                         "cannot be broadcast together") from None


def add(a, b):
    return _binary(Add, a, b)


def sub(a, b):
    return _binary(Sub, a, b)


def mul(a, b):
    return _binary(Mul, a, b)


def div(a, b):
    return _binary(Div, a, b)


def pow(a, b):  # noqa: A001 - the operator's name
    return _binary(Pow, a, b)


def neg(a):
    return Neg.apply(a)


def matmul(a, b):
    """a @ b with NumPy's rules: 1-D operands are lifted to matrices and the
    added axis is removed again."""
    a, b = as_tensor_like(a, a), as_tensor_like(b, a)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: scalar operands are not allowed (shapes {a.shape}, {b.shape})")
    xp_of(a.data, b.data)
    if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} are not aligned")
    lift_a, lift_b = a.ndim == 1, b.ndim == 1
    a2 = reshape(a, (1, a.shape[0])) if lift_a else a
    b2 = reshape(b, (b.shape[0], 1)) if lift_b else b
    out = MatMul.apply(a2, b2)
    if lift_a or lift_b:
        rows = () if lift_a else out.shape[-2:-1]
        cols = () if lift_b else out.shape[-1:]
        out = reshape(out, out.shape[:-2] + rows + cols)
    return out


def reshape(a, *shape):
    shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    return Reshape.apply(a, shape=tuple(shape))


def transpose(a, *axes):
    axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
    return Transpose.apply(a, axes=tuple(axes) if axes else None)


def getitem(a, index):
    if isinstance(index, Tensor):
        index = index.data
    elif isinstance(index, tuple):
        index = tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return Index.apply(a, index=index)


def _reduction(cls):
    def reduce(a, axis=None, keepdims=False):
        return cls.apply(a, axis=axis, keepdims=keepdims)
    reduce.__name__ = cls.__name__.lower()
    return reduce


sum_, mean, max_ = _reduction(Sum), _reduction(Mean), _reduction(Max)


def _unary(cls):
    def op(a):
        return cls.apply(a)
    op.__name__ = cls.__name__.lower()
    return op


exp, log, sqrt, tanh, sigmoid, relu = (_unary(c) for c in (Exp, Log, Sqrt, Tanh, Sigmoid, ReLU))


def _compare(op):
    def compare(a, b):
        b = b.data if isinstance(b, Tensor) else b
        return Tensor(op(a.data, b))  # no graph: comparisons have no gradient
    return compare


def _reflected(fn):
    return lambda a, b: fn(as_tensor_like(b, a), a)


# operator / method name on Tensor -> function, bound once at import
TENSOR_METHODS = {
    "__add__": add, "__radd__": add, "__sub__": sub, "__rsub__": _reflected(sub),
    "__mul__": mul, "__rmul__": mul, "__truediv__": div, "__rtruediv__": _reflected(div),
    "__pow__": pow, "__rpow__": _reflected(pow), "__neg__": neg,
    "__matmul__": matmul, "__rmatmul__": _reflected(matmul), "__getitem__": getitem,
    "__lt__": _compare(operator.lt), "__le__": _compare(operator.le),
    "__gt__": _compare(operator.gt), "__ge__": _compare(operator.ge),
    "__eq__": _compare(operator.eq), "__ne__": _compare(operator.ne),
    "sum": sum_, "mean": mean, "max": max_, "reshape": reshape, "transpose": transpose,
    "exp": exp, "log": log, "sqrt": sqrt, "tanh": tanh, "sigmoid": sigmoid, "relu": relu,
    "T": property(lambda a: transpose(a)),
}
for _name, _fn in TENSOR_METHODS.items():
    setattr(Tensor, _name, _fn)
