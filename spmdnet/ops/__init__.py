"""The op registry: every differentiable op, the wrappers that turn Python
arguments into tensors, and the table binding operators and methods onto
Tensor. Grep here to find any op.
"""
from .._tensor import Tensor
from . import compare, reduce, sort, unary
from .arith import Add, Div, Mul, Neg, Pow, Sub, add, div, mul, neg, pow, rdiv, rpow, rsub, sub
from .arith import as_tensor_like  # noqa: F401 - functional.py imports it from here
from .einsum import Einsum
from .linalg import Linear, LinearAct, MatMul, bmm, matmul, rmatmul
from .activations import ELU, LeakyReLU, SiLU, Softplus
from .losses import CrossEntropy, CrossEntropyProbs, NLLLoss
from .nn_ops import Dropout, Embedding, LayerNorm, LogSoftmax, Normalize, Pad, Softmax
from .pointwise_losses import BCELoss, BCEWithLogitsLoss, L1Loss, MSELoss, SmoothL1Loss
from .reduce import Amax, Amin, LogSumExp, Mean, Norm, Prod, SelectAlong, Sum, Var
from .select import Maximum, Minimum, Where, clamp, masked_fill, maximum, minimum, where
from .sort import Permuted
from . import convert, gather, index, inplace, methods, pointwise, scan, shape
from .gather import Diag, Gather, Scatter
from .methods import Clone
from .pointwise import Square, Step
from .scan import Cumprod, Cumsum, Flip, Roll
from .batchnorm import BatchNorm, BatchNormEval
from .conv import Conv2d
from .pooling import AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, MaxPool2d
from .convert import ToDevice, array_ufunc
from .index import Concatenate, Index, Stack, Triangle, getitem
from .shape import Contiguous, Expand, Permute, Repeat, Reshape, reshape
from .unary import (GELU, Abs, Clamp, Cos, Exp, Log, Log1p, ReLU, Rsqrt, Sigmoid, Sin, Sqrt,
                    Tanh, exp, log, relu, sigmoid, sqrt, tanh)

REGISTRY = {
    "add": Add, "sub": Sub, "mul": Mul, "div": Div, "neg": Neg, "pow": Pow,
    "matmul": MatMul, "einsum": Einsum, "linear": Linear, "linear_act": LinearAct,
    "exp": Exp, "log": Log, "log1p": Log1p, "sqrt": Sqrt, "rsqrt": Rsqrt, "sin": Sin,
    "cos": Cos, "abs": Abs, "clamp": Clamp, "tanh": Tanh, "sigmoid": Sigmoid,
    "relu": ReLU, "gelu": GELU, "where": Where, "maximum": Maximum, "minimum": Minimum,
    "sum": Sum, "mean": Mean, "var": Var, "prod": Prod, "amax": Amax, "amin": Amin,
    "logsumexp": LogSumExp, "norm": Norm, "select_along": SelectAlong, "permuted": Permuted,
    "reshape": Reshape, "permute": Permute, "expand": Expand, "repeat": Repeat,
    "contiguous": Contiguous, "index": Index, "concatenate": Concatenate, "stack": Stack,
    "triangle": Triangle, "to_device": ToDevice, "clone": Clone,
    "square": Square, "step": Step, "cumsum": Cumsum, "cumprod": Cumprod, "flip": Flip,
    "roll": Roll, "gather": Gather, "scatter": Scatter, "diag": Diag,
    "softmax": Softmax, "log_softmax": LogSoftmax, "dropout": Dropout, "layer_norm": LayerNorm,
    "embedding": Embedding, "pad": Pad, "normalize": Normalize,
    "silu": SiLU, "leaky_relu": LeakyReLU, "elu": ELU, "softplus": Softplus,
    "cross_entropy": CrossEntropy, "cross_entropy_probs": CrossEntropyProbs,
    "nll_loss": NLLLoss, "mse_loss": MSELoss, "l1_loss": L1Loss, "smooth_l1_loss": SmoothL1Loss,
    "binary_cross_entropy": BCELoss, "binary_cross_entropy_with_logits": BCEWithLogitsLoss,
    "batch_norm": BatchNorm, "batch_norm_eval": BatchNormEval,
    "conv2d": Conv2d, "max_pool2d": MaxPool2d, "avg_pool2d": AvgPool2d,
    "adaptive_avg_pool2d": AdaptiveAvgPool2d, "adaptive_max_pool2d": AdaptiveMaxPool2d,
}


# operator / method name on Tensor -> function, bound once at import
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
    # clone, requires_grad_, softmax, new_zeros & co., normal_, uniform_, type (ops/methods.py)
    **methods.METHODS,
    # type and device (ops/convert.py)
    "to": convert.to, "type_as": convert.type_as, "cpu": convert.cpu, "cuda": convert.cuda,
    **convert.CASTS, "__array_ufunc__": array_ufunc,
    # in place on .data, no graph: +=, *=, zero_, add_, copy_, t[i] = v (ops/inplace.py)
    **inplace.METHODS,
}
for _name, _fn in TENSOR_METHODS.items():
    setattr(Tensor, _name, _fn)
