"""The ops: one module per family of differentiable ops (``Function``
subclasses and the wrappers that turn Python arguments into tensors), and
``TENSOR_METHODS``, the one table of the operators and methods that
``bind_tensor_methods()`` puts onto Tensor. Grep that table to find the op
behind any Tensor method.
"""
from .._tensor import Tensor
from . import compare, complex, convert, gather, index, inplace, methods, pointwise, reduce
from . import sampling, scan, shape, shared_storage, sort, unary
from . import _meta_rules  # noqa: F401 - registers the ops' shape rules for meta tensors
from .arith import add, as_tensor_like, div, mul, neg, pow, rdiv, rpow, rsub, sub
from .convert import array_ufunc
from .index import getitem
from .linalg import Linear, LinearAct, bmm, matmul, rmatmul
from .nn_ops import Dropout, Embedding, LayerNorm, LogSoftmax, Normalize, Pad, Softmax
from .select import clamp, masked_fill, maximum, minimum, where
from .shape import reshape
from .unary import GELU, exp, log, relu, sigmoid, sqrt, tanh

# what functional.py (and benchmarks) import from the package rather than from a family
__all__ = ["GELU", "Dropout", "Embedding", "LayerNorm", "Linear", "LinearAct", "LogSoftmax",
           "Normalize", "Pad", "Softmax", "as_tensor_like", "exp", "log", "matmul", "relu",
           "sigmoid", "sqrt", "tanh", "TENSOR_METHODS", "bind_tensor_methods"]

# operator / method name on Tensor -> function (bind_tensor_methods)
TENSOR_METHODS = {
    # arithmetic, PyTorch's type promotion (ops/arith.py, ops/linalg.py)
    "__add__": add, "__radd__": add, "__sub__": sub, "__rsub__": rsub,
    "__mul__": mul, "__rmul__": mul, "__truediv__": div, "__rtruediv__": rdiv,
    "__pow__": pow, "__rpow__": rpow, "__neg__": neg, "__abs__": unary.abs,
    "__matmul__": matmul, "__rmatmul__": rmatmul, "__getitem__": getitem,
    "add": add, "sub": sub, "mul": mul, "div": div, "pow": pow, "neg": neg,
    "matmul": matmul, "bmm": bmm,
    # comparisons and logic, bool tensors (ops/compare.py)
    "__lt__": compare.lt, "__le__": compare.le, "__gt__": compare.gt, "__ge__": compare.ge,
    "__eq__": compare.eq, "__ne__": compare.ne, "lt": compare.lt, "le": compare.le,
    "gt": compare.gt, "ge": compare.ge, "eq": compare.eq, "ne": compare.ne,
    "__and__": compare.bitwise_and, "__rand__": compare.bitwise_and,
    "__or__": compare.bitwise_or, "__ror__": compare.bitwise_or,
    "__xor__": compare.bitwise_xor, "__rxor__": compare.bitwise_xor,
    "__invert__": compare.bitwise_not, "bitwise_not": compare.bitwise_not,
    "logical_and": compare.logical_and, "logical_or": compare.logical_or,
    "logical_xor": compare.logical_xor, "logical_not": compare.logical_not,
    "isfinite": compare.isfinite, "isnan": compare.isnan, "isinf": compare.isinf,
    "equal": compare.equal,
    # elementwise (ops/unary.py, ops/select.py)
    "exp": exp, "log": log, "log1p": unary.log1p, "sqrt": sqrt, "rsqrt": unary.rsqrt,
    "sin": unary.sin, "cos": unary.cos, "abs": unary.abs, "tanh": tanh, "sigmoid": sigmoid,
    "relu": relu, "clamp": clamp, "clip": clamp, "maximum": maximum, "minimum": minimum,
    "where": lambda a, condition, other: where(condition, a, other),
    "masked_fill": masked_fill,
    "square": pointwise.square, "sign": pointwise.sign, "floor": pointwise.floor,
    "ceil": pointwise.ceil, "round": pointwise.round, "trunc": pointwise.trunc,
    "lerp": pointwise.lerp, "outer": pointwise.outer, "addmm": pointwise.addmm,
    # reductions and sorting (ops/reduce.py, ops/sort.py)
    "sum": reduce.sum, "mean": reduce.mean, "var": reduce.var, "std": reduce.std,
    "prod": reduce.prod, "amax": reduce.amax, "amin": reduce.amin, "max": reduce.max,
    "min": reduce.min, "argmax": reduce.argmax, "argmin": reduce.argmin,
    "logsumexp": reduce.logsumexp, "any": reduce.any, "all": reduce.all, "norm": reduce.norm,
    "sort": sort.sort, "argsort": sort.argsort, "topk": sort.topk,
    "cumsum": scan.cumsum, "cumprod": scan.cumprod,
    # shape (ops/shape.py, ops/index.py)
    "reshape": reshape, "view": shape.view, "view_as": shape.view_as,
    "reshape_as": shape.reshape_as, "permute": shape.permute, "transpose": shape.transpose,
    "swapaxes": shape.transpose, "swapdims": shape.transpose, "t": shape.t,
    "T": property(shape.T), "mT": property(shape.mT), "flatten": shape.flatten,
    "unflatten": shape.unflatten, "unsqueeze": shape.unsqueeze, "squeeze": shape.squeeze,
    "expand": shape.expand, "expand_as": shape.expand_as, "repeat": shape.repeat,
    "contiguous": shape.contiguous, "narrow": index.narrow, "split": index.split,
    "chunk": index.chunk, "unbind": index.unbind, "tril": index.tril, "triu": index.triu,
    "flip": scan.flip, "roll": scan.roll, "gather": gather.gather, "scatter": gather.scatter,
    "scatter_add": gather.scatter_add, "index_select": gather.index_select,
    "repeat_interleave": gather.repeat_interleave, "diag": gather.diag,
    # clone, requires_grad_, softmax, new_zeros & co., type (ops/methods.py)
    **methods.METHODS,
    # complex views and parts (ops/complex.py); sampling (ops/sampling.py)
    **complex.METHODS, **sampling.METHODS,
    # type and device (ops/convert.py)
    "to": convert.to, "type_as": convert.type_as, "cpu": convert.cpu, "cuda": convert.cuda,
    **convert.CASTS, "__array_ufunc__": array_ufunc,
    # in place on .array, no graph: +=, *=, zero_, add_, copy_, t[i] = v (ops/inplace.py)
    **inplace.METHODS,
    # share_memory_, is_shared (ops/shared_storage.py; pickling: multiprocessing/reductions.py)
    **shared_storage.METHODS,
}


def bind_tensor_methods():
    """Put every operator and method of ``TENSOR_METHODS`` onto Tensor
    (``_tensor.py`` knows no op by name). ``spmdnet/__init__.py`` calls it
    before importing anything that computes; calling it again changes nothing."""
    for name, fn in TENSOR_METHODS.items():
        setattr(Tensor, name, fn)
