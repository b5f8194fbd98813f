"""Matrix products: matmul (2-D and batched), bmm, einsum, the linear layer,
and the linear layer fused with its activation. Operands of different dtypes
raise naming both, as PyTorch's (no silent upcast of a float32 model to a
float64 batch)."""
import math

from .. import kernels
from .._tensor import Tensor, _as_array
from ..autograd import Function
from ..backend import xp_of
from ._util import unbroadcast
from .unary import act_backward, act_forward


def check_dtypes(name, a, b, what=("m1", "m2")):
    """RuntimeError naming both dtypes when arrays a and b differ in dtype."""
    if a.dtype != b.dtype:
        raise RuntimeError(f"{name}: expected {what[0]} and {what[1]} to have the same dtype, "
                           f"but got: {a.dtype} != {b.dtype}")


def _swap(a):
    return a.swapaxes(-1, -2)


def _matmul(a, b, out, shape):
    """a @ b, written into ``out`` when the product has exactly its shape."""
    if out is not None and a.shape[:-1] + b.shape[-1:] == shape and a.ndim == len(shape):
        return xp_of(a).matmul(a, b, out=out)
    return a @ b


class MatMul(Function):
    """a @ b with NumPy's (and PyTorch's) rules: batch dims broadcast, a 1-D
    operand is a vector (lifted to a matrix and the added dim removed)."""

    def forward(self, a, b):
        check_dtypes("matmul", a, b)
        if a.ndim == 0 or b.ndim == 0:
            raise RuntimeError(f"matmul: both arguments need at least 1 dimension, got "
                               f"shapes {a.shape} and {b.shape}")
        if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
            raise ValueError(f"matmul: shapes {a.shape} and {b.shape} are not aligned")
        self.a, self.b = a, b
        return a @ b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        a = self.a[None] if self.a.ndim == 1 else self.a
        b = self.b[:, None] if self.b.ndim == 1 else self.b
        g = g[..., None] if self.b.ndim == 1 else g
        g = g[..., None, :] if self.a.ndim == 1 else g
        ga = gb = None
        if need_a:
            ga = unbroadcast(_matmul(g, _swap(b), self.dest(0), a.shape), a.shape)
            ga = ga.reshape(self.a.shape)
        if need_b:
            gb = unbroadcast(_matmul(_swap(a), g, self.dest(1), b.shape), b.shape)
            gb = gb.reshape(self.b.shape)
        return ga, gb


def _tensor(x):
    return x if isinstance(x, Tensor) else Tensor(_as_array(x))


def matmul(input, other):  # noqa: A002 - PyTorch's argument names
    """input @ other (1-D operands are vectors, batch dims broadcast); the
    dtypes must agree, as PyTorch's."""
    a, b = _tensor(input), _tensor(other)
    xp_of(a.array, b.array)  # NumPy with CuPy raises TypeError naming both
    return MatMul.apply(a, b)


def rmatmul(a, b):
    return matmul(b, a)


def bmm(input, mat2):  # noqa: A002
    """Batched product of (b, n, m) and (b, m, p) tensors."""
    if input.ndim != 3 or mat2.ndim != 3:
        raise RuntimeError(f"bmm: batch1 and batch2 must be 3-D tensors, got shapes "
                           f"{input.shape} and {mat2.shape}")
    if input.shape[0] != mat2.shape[0]:
        raise RuntimeError(f"bmm: batch sizes differ: {input.shape} and {mat2.shape}")
    return matmul(input, mat2)


def buffer_for(dest, shape, dtype):
    """``dest`` (a gradient buffer from ``Function.dest``) when a kernel may
    write a gradient of this shape and dtype into it, else None."""
    if dest is None or dest.shape != tuple(shape) or dest.dtype != dtype \
            or not dest.flags.c_contiguous:
        return None
    return dest


def _check_linear(x, weight, bias=()):
    if x.dtype != weight.dtype:
        check_dtypes("linear", x, weight, ("input", "weight"))
    if bias and bias[0].dtype != weight.dtype:
        check_dtypes("linear", bias[0], weight, ("bias", "weight"))
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input shape {x.shape} does not match weight shape "
                         f"{weight.shape} (in_features {weight.shape[1]})")


def rows_matmul(a, b):
    """a @ b for a 2-D b, with a's leading dims flattened into one: one large
    GEMM rather than NumPy's loop of small ones over a stacked a (1.5x faster
    for a (16, 64, 128) activation)."""
    if a.ndim <= 2:
        return a @ b
    return (as_rows(a) @ b).reshape(a.shape[:-1] + b.shape[-1:])


def as_rows(a):
    """a as (rows, last dim); not reshape(-1, n): a size-0 array cannot infer -1."""
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


def _linear_grads(ctx, g, gb=None):
    """(gx, gw[, gb]) of x @ weight.T + bias from the output gradient g;
    gb, when the caller has it already, is used as the bias gradient."""
    need = ctx.needs_input_grad
    gx = rows_matmul(g, ctx.weight) if need[0] else None
    g2, x2 = as_rows(g), as_rows(ctx.x)
    gw = _matmul(g2.T, x2, ctx.dest(1), ctx.weight.shape) if need[1] else None
    if len(need) == 2:
        return gx, gw
    if need[2] and gb is None:
        gb = g2.sum(axis=0)
    return gx, gw, (gb if need[2] else None)


class Linear(Function):
    """x @ weight.T (+ bias), weight (out, in): one op so backward does three
    products and no broadcasting bookkeeping. x may have leading batch dims."""

    def forward(self, x, weight, *bias):
        _check_linear(x, weight, bias)
        self.x, self.weight = x, weight
        out = rows_matmul(x, weight.T)
        if bias:
            out += bias[0]
        return out

    def backward(self, g):
        return _linear_grads(self, g)


class LinearAct(Function):
    """activation(x @ weight.T + bias) as one op (relu, gelu, gelu_tanh, tanh,
    sigmoid). Where ``kernels.lookup("linear_<activation>", ...)`` gives
    kernels, bias and activation are one pass in place over the product's
    fresh output, and backward's one pass gives both the gradient before the
    activation and the bias gradient, written straight into a gradient
    buffer when there is one. Otherwise: the xp ops' math, the same values."""

    def forward(self, x, weight, *bias, activation="relu"):
        _check_linear(x, weight, bias)
        self.x, self.weight, self.activation = x, weight, activation
        h = rows_matmul(x, weight.T)
        b = bias[0] if bias else None
        kernel = kernels.lookup(f"linear_{activation}", h, b)
        self.backward_kernel = kernels.lookup(f"linear_{activation}", h, b, step="backward")
        if kernel is not None:
            out, self.saved = kernel(h, b)
        else:
            if b is not None:
                h += b
            out, self.saved = act_forward(activation, h)
        return out

    def backward(self, g):
        need, name = self.needs_input_grad, self.activation
        want_gb = len(need) == 3 and need[2]
        if self.backward_kernel is not None:
            dest = buffer_for(self.dest(2), g.shape[-1:], g.dtype) if want_gb else None
            gh, gb = self.backward_kernel(g, self.saved, bias_grad=want_gb, bias_out=dest)
            return _linear_grads(self, gh, gb)
        return _linear_grads(self, act_backward(name, g, self.saved))
