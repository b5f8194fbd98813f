"""Matrix products: matmul (2-D and batched), the linear layer, and the
linear layer fused with its activation."""
from .. import kernels
from ..autograd import Function
from ..backend import xp_of
from ._util import unbroadcast
from .unary import act_backward, act_forward


def _swap(a):
    return a.swapaxes(-1, -2)


def _matmul(a, b, out, shape):
    """a @ b, written into ``out`` when the product has exactly its shape."""
    if out is not None and a.shape[:-1] + b.shape[-1:] == shape and a.ndim == len(shape):
        return xp_of(a).matmul(a, b, out=out)
    return a @ b


class MatMul(Function):
    """a @ b for a, b with ndim >= 2 (batch dims broadcast); the functional
    wrapper lifts 1-D operands to matrices."""

    def forward(self, a, b):
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(f"matmul: shapes {a.shape} and {b.shape} are not aligned "
                             f"({a.shape[-1]} != {b.shape[-2]})")
        self.a, self.b = a, b
        return a @ b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        ga = gb = None
        if need_a:
            ga = unbroadcast(_matmul(g, _swap(self.b), self.dest(0), self.a.shape), self.a.shape)
        if need_b:
            gb = unbroadcast(_matmul(_swap(self.a), g, self.dest(1), self.b.shape), self.b.shape)
        return ga, gb


def buffer_for(dest, shape, dtype):
    """``dest`` (a gradient buffer from ``Function.dest``) when a kernel may
    write a gradient of this shape and dtype into it, else None."""
    if dest is None or dest.shape != tuple(shape) or dest.dtype != dtype \
            or not dest.flags.c_contiguous:
        return None
    return dest


def _check_linear(x, weight):
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input shape {x.shape} does not match weight shape "
                         f"{weight.shape} (in_features {weight.shape[1]})")


def _linear_grads(ctx, g, gb=None):
    """(gx, gw[, gb]) of x @ weight.T + bias from the output gradient g;
    gb, when the caller has it already, is used as the bias gradient."""
    need = ctx.needs_input_grad
    gx = g @ ctx.weight if need[0] else None
    g2 = g.reshape(-1, g.shape[-1])
    x2 = ctx.x.reshape(-1, ctx.x.shape[-1])
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
        _check_linear(x, weight)
        self.x, self.weight = x, weight
        out = x @ weight.T
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
        _check_linear(x, weight)
        self.x, self.weight, self.activation = x, weight, activation
        h = x @ weight.T
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
