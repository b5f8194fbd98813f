"""Bias + activation in one pass, forward and backward.

The fused linear layer (``ops.linalg.LinearAct``) runs ``activation(x @ W.T
+ b)`` as one product and one pass of ``forward`` over its fresh output (in
place for relu, tanh, sigmoid); one pass of ``backward`` gives the gradient
before the activation and the bias gradient (column sums in row order: the
bits of NumPy's ``sum(axis=0)``). The activation ops use them without bias.

What is saved works with the xp reference (``ops.unary.act_forward`` and
``act_backward``) too: the output for tanh and sigmoid; for relu the output
(xp) or the mask output > 0 (a quarter of the bytes); (input, Φ(input)) for
gelu, (input, tanh(...)) for gelu_tanh. Which ops use them: dispatch.py.
"""
import functools
import math

import numpy as np

from ..backend import xp_of
from . import reduce, special
from ._cpu import CpuKernel
from ._cuda import Builder, launch
from ._numba import njit_inline, prange
from ._target import check_target

ACTIVATIONS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "tanh": 3, "sigmoid": 4}
# The xp formulas, but gelu_tanh and sigmoid use 1 / (1 + exp(-x)) for 0.5 (1 +
# tanh(x / 2)): the same function, more accurate with special.py's float32 tanh.
RELU, GELU, GELU_TANH, TANH, SIGMOID = range(5)
SAVES_INPUT = {"gelu", "gelu_tanh"}  # saved: (input, aux); the others: the output

_CONSTANTS = (0.0, 1.0, 0.5, 1.0 / math.sqrt(2.0), 1.0 / math.sqrt(2.0 * math.pi),
              math.sqrt(2.0 / math.pi), 0.044715, 3 * 0.044715)


@functools.lru_cache
def _constants(dtype):
    """The constants above in ``dtype``, so float32 kernels compute in float32
    with float32-rounded constants, as NumPy does with the xp ops."""
    return tuple(dtype.type(c) for c in _CONSTANTS)


# -- the activations: value (and aux, what backward needs besides) and gradient ---------
# c holds _CONSTANTS in the arrays' dtype; the formulas follow ops.unary's.
@njit_inline
def _relu(v, c):
    return (c[0] if v < c[0] else v), v > c[0]  # NaN and -0.0 pass, as np.maximum


@njit_inline
def _relu_grad(g, y, aux, c):
    return g * (c[1] if y > c[0] else c[0])  # y: the output, or the mask y > 0


@njit_inline
def _gelu(v, c):
    cdf = c[2] * (c[1] + special.erf(v * c[3]))
    return v * cdf, cdf


@njit_inline
def _gelu_grad(g, x, cdf, c):
    return g * (cdf + x * (c[4] * special.exp(-c[2] * x * x)))


@njit_inline
def _gelu_tanh(v, c):
    # 0.5 v (1 + tanh(z)) = v s with s = 1 / (1 + e**-2z), and tanh(z) = 2 s - 1:
    # accurate where 1 + tanh(z) is small (z << 0), unlike 1 + a tanh polynomial
    z = c[5] * (v + c[6] * (v * v * v))
    s = c[1] / (c[1] + special.exp(-(z + z)))
    return v * s, (s + s) - c[1]


@njit_inline
def _gelu_tanh_grad(g, x, t, c):
    dt = (c[1] - t * t) * c[5] * (c[1] + c[7] * x * x)
    return g * (c[2] * (c[1] + t) + c[2] * x * dt)


@njit_inline
def _tanh(v, c):
    return special.tanh(v), c[0]


@njit_inline
def _tanh_grad(g, y, aux, c):
    return g * (c[1] - y * y)


@njit_inline
def _sigmoid(v, c):
    return c[1] / (c[1] + special.exp(-v)), c[0]  # e**-v = inf gives 0, as it should


@njit_inline
def _sigmoid_grad(g, y, aux, c):
    return g * y * (c[1] - y)


@njit_inline
def _value(v, kind, c):
    """(activation, aux) of kind ``kind``, chosen per element (CUDA kernels)."""
    if kind == RELU:
        y, positive = _relu(v, c)
        return y, (c[1] if positive else c[0])  # one tuple type for every kind
    if kind == GELU:
        return _gelu(v, c)
    if kind == GELU_TANH:
        return _gelu_tanh(v, c)
    if kind == TANH:
        return _tanh(v, c)
    return _sigmoid(v, c)


@njit_inline
def _grad(g, s, aux, kind, c):
    if kind == RELU:
        return _relu_grad(g, s, aux, c)
    if kind == GELU:
        return _gelu_grad(g, s, aux, c)
    if kind == GELU_TANH:
        return _gelu_tanh_grad(g, s, aux, c)
    if kind == TANH:
        return _tanh_grad(g, s, aux, c)
    return _sigmoid_grad(g, s, aux, c)


# -- loops over rows, generic in the scalar function ----------------------------------
@njit_inline
def _map_inplace(h, bias, aux, fn, c):
    """h, aux = fn(h + bias) (bias and aux may be empty)."""
    with_bias, with_aux = bias.shape[0] > 0, aux.shape[1] > 0
    for i in prange(h.shape[0]):
        for j in range(h.shape[1]):
            y, a = fn(h[i, j] + bias[j] if with_bias else h[i, j], c)
            h[i, j] = y
            if with_aux:
                aux[i, j] = a


@njit_inline
def _map(x, bias, out, aux, store_pre, fn, c):
    """out, aux = fn(x + bias); with store_pre also x = x + bias (aux may be empty);
    call with a constant store_pre (a variable one stopped LLVM vectorising sigmoid)."""
    with_bias, with_aux = bias.shape[0] > 0, aux.shape[1] > 0
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            v = x[i, j] + bias[j] if with_bias else x[i, j]
            if store_pre:
                x[i, j] = v
            y, a = fn(v, c)
            out[i, j] = y
            if with_aux:
                aux[i, j] = a


@njit_inline
def _grad_map(g, saved, aux, gx, gb, with_aux, with_bias, fn, c):
    """gx = fn(g, saved, aux); with_bias also gb = column sums of gx in row
    order. Constant flags: one tested per element stops LLVM vectorising."""
    for i in range(g.shape[0]):  # serial: gb accumulates in row order
        for j in range(g.shape[1]):
            d = fn(g[i, j], saved[i, j], aux[i, j] if with_aux else c[0], c)
            gx[i, j] = d
            if with_bias:
                gb[j] = gb[j] + d if i > 0 else d  # row 0 starts: NumPy's bits, -0.0 too


@njit_inline
def _grad_rows(g, saved, aux, gx, gb, with_aux, fn, c):  # the bias flag made a constant
    if gb.shape[0] > 0:
        _grad_map(g, saved, aux, gx, gb, with_aux, True, fn, c)
    else:
        _grad_map(g, saved, aux, gx, gb, with_aux, False, fn, c)


# -- the kernels: one per activation, so that each loop is specialised to one
# scalar function and vectorises, and a run compiles only what it uses -------------
def _relu_forward_inplace(h, bias, aux, c):
    _map_inplace(h, bias, aux, _relu, c)


def _tanh_forward_inplace(h, bias, aux, c):
    _map_inplace(h, bias, aux, _tanh, c)


def _sigmoid_forward_inplace(h, bias, aux, c):
    _map_inplace(h, bias, aux, _sigmoid, c)


def _relu_forward(x, bias, out, aux, c):
    _map(x, bias, out, aux, False, _relu, c)


def _gelu_forward(x, bias, out, aux, store_pre, c):
    if store_pre:  # constant flags in each loop: LLVM vectorises both reliably
        _map(x, bias, out, aux, True, _gelu, c)
    else:
        _map(x, bias, out, aux, False, _gelu, c)


def _gelu_tanh_forward(x, bias, out, aux, store_pre, c):
    if store_pre:
        _map(x, bias, out, aux, True, _gelu_tanh, c)
    else:
        _map(x, bias, out, aux, False, _gelu_tanh, c)


def _tanh_forward(x, bias, out, aux, c):
    _map(x, bias, out, aux, False, _tanh, c)


def _sigmoid_forward(x, bias, out, aux, c):
    _map(x, bias, out, aux, False, _sigmoid, c)


def _relu_backward(g, saved, aux, gx, gb, c):
    _grad_rows(g, saved, aux, gx, gb, False, _relu_grad, c)


def _gelu_backward(g, saved, aux, gx, gb, c):
    _grad_rows(g, saved, aux, gx, gb, True, _gelu_grad, c)


def _gelu_tanh_backward(g, saved, aux, gx, gb, c):
    _grad_rows(g, saved, aux, gx, gb, True, _gelu_tanh_grad, c)


def _tanh_backward(g, saved, aux, gx, gb, c):
    _grad_rows(g, saved, aux, gx, gb, False, _tanh_grad, c)


def _sigmoid_backward(g, saved, aux, gx, gb, c):
    _grad_rows(g, saved, aux, gx, gb, False, _sigmoid_grad, c)


# (in place, forward, backward) bodies; gelu's input is saved: no in-place forward
_BODIES = {
    "relu": (_relu_forward_inplace, _relu_forward, _relu_backward),
    "gelu": (None, _gelu_forward, _gelu_backward),
    "gelu_tanh": (None, _gelu_tanh_forward, _gelu_tanh_backward),
    "tanh": (_tanh_forward_inplace, _tanh_forward, _tanh_backward),
    "sigmoid": (_sigmoid_forward_inplace, _sigmoid_forward, _sigmoid_backward),
}
_cpu = {(name, step): CpuKernel(body) for name, bodies in _BODIES.items()
        for step, body in zip(("forward_inplace", "forward", "backward"), bodies) if body}

cuda = None  # numba.cuda, bound by _cuda.Builder (the CUDA simulator swaps this global)


@Builder
def _cuda_kernels():
    """One kernel per step for every activation (``kind`` picks it per element)."""
    def forward(x, bias, out, aux, store_pre, kind, c):
        k = cuda.grid(1)
        if k < x.size:
            i, j = k // x.shape[1], k % x.shape[1]
            v = x[i, j] + bias[j] if bias.shape[0] > 0 else x[i, j]
            if store_pre:
                x[i, j] = v
            y, a = _value(v, kind, c)
            out[i, j] = y
            if aux.shape[1] > 0:
                aux[i, j] = a

    def backward(g, saved, aux, gx, kind, c):
        k = cuda.grid(1)
        if k < g.size:
            i, j = k // g.shape[1], k % g.shape[1]
            gx[i, j] = _grad(g[i, j], saved[i, j], aux[i, j] if aux.shape[1] > 0 else c[0],
                             kind, c)

    def column_sums(a, out):  # one thread per column, rows in order: deterministic
        j = cuda.grid(1)
        if j < a.shape[1]:
            acc = a[0, j]
            for i in range(1, a.shape[0]):
                acc += a[i, j]
            out[j] = acc

    return {"forward": forward, "backward": backward, "column_sums": column_sums}


def _code(activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, "
                         f"got {activation!r}")
    return ACTIVATIONS[activation]


def forward(x, bias=None, activation="relu", inplace=False):
    """``(out, saved)``: out = activation(x + bias) over the last axis, and
    what ``backward`` (or ``ops.unary.act_backward``) needs.

    ``inplace=True`` says x is a fresh C-contiguous buffer the caller owns
    (a product's output): out is x itself for relu/tanh/sigmoid, and for
    gelu x receives x + bias. Otherwise x is left untouched."""
    kind = _code(activation)
    where = check_target("activation", x, bias)
    if bias is not None and bias.shape != x.shape[-1:]:
        raise ValueError(f"bias of shape {bias.shape} does not match the last axis of "
                         f"the input {x.shape}")
    if inplace and not x.flags.c_contiguous:
        raise ValueError("inplace=True needs a C-contiguous input")
    xp = xp_of(x)
    b = bias if bias is not None else xp.empty(0, x.dtype)
    b = b if b.flags.c_contiguous else xp.ascontiguousarray(b)
    c = _constants(x.dtype)
    if activation in SAVES_INPUT:  # out and aux are new; x + bias is saved too
        out, aux = xp.empty(x.shape, x.dtype), xp.empty(x.shape, x.dtype)
        if x.size == 0:
            return out, (x, aux)
        x2 = reduce.rows(xp, x)
        store_pre = inplace and bias is not None
        if bias is not None and not inplace:  # x + bias needs a home of its own
            x2, b = x2 + b, b[:0]
        out2, aux2 = out.reshape(x2.shape), aux.reshape(x2.shape)
        _run_forward(where, activation, kind, x, (x2, b, out2, aux2, store_pre, c))
        return out, (x2.reshape(x.shape), aux)
    out = x if inplace else xp.empty(x.shape, x.dtype)
    # relu saves a boolean mask (out > 0): backward then streams 1 byte per
    # element instead of the 4 of the output (and act_backward accepts it too)
    mask = xp.empty(x.shape, np.bool_) if activation == "relu" else None
    saved = mask if mask is not None else out
    if x.size == 0:
        return out, saved
    x2 = reduce.rows(xp, x)
    aux2 = mask.reshape(x2.shape) if mask is not None else x2[:, :0]
    if where == "cpu" and inplace:
        _cpu[activation, "forward_inplace"](x2, b, aux2, c)
    else:
        _run_forward(where, activation, kind, x, (x2, b, out.reshape(x2.shape), aux2, False, c))
    return out, saved


def _run_forward(where, activation, kind, x, args):
    """args: (x2, bias, out2, aux2, store_pre, constants)."""
    if where == "cpu" and activation in SAVES_INPUT:
        _cpu[activation, "forward"](*args)
    elif where == "cpu":  # store_pre is False: no x + bias to keep
        _cpu[activation, "forward"](*args[:4], args[5])
    else:
        launch(_cuda_kernels()["forward"], args[0].size, *args[:5], kind, args[5],
               stream_of=x)


def backward(g, saved, activation="relu", bias_grad=False, bias_out=None):
    """``(gx, gb)``: the gradient before the activation, from ``forward``'s
    saved, and (with ``bias_grad``) its sum over all but the last axis,
    written into ``bias_out`` when given (a gradient buffer), else new."""
    kind = _code(activation)
    s, aux = saved if activation in SAVES_INPUT else (saved, None)
    mask = s.dtype == np.bool_
    if mask and activation != "relu":
        raise TypeError(f"a boolean saved array is relu's mask, not {activation}'s")
    where = check_target("activation", g, None if mask else s, aux, bias_out)
    if g.shape != s.shape or (aux is not None and aux.shape != s.shape):
        raise ValueError(f"gradient shape {g.shape} does not match the saved "
                         f"{s.shape}{'' if aux is None else f' and {aux.shape}'}")
    m = g.shape[-1] if g.ndim else 1
    if bias_out is not None and (bias_out.shape != (m,) or not bias_out.flags.c_contiguous):
        raise ValueError(f"bias_out must be C-contiguous of shape ({m},), got "
                         f"{bias_out.shape}")
    xp = xp_of(g)
    gb = None
    if bias_grad:
        gb = bias_out if bias_out is not None else xp.empty(m, g.dtype)
    gx = xp.empty(g.shape, g.dtype)
    if g.size == 0:
        if gb is not None:
            gb[...] = 0
        return gx, gb
    c = _constants(g.dtype)
    g2, s2, gx2 = reduce.rows(xp, g), reduce.rows(xp, s), gx.reshape(-1, m)
    aux2 = reduce.rows(xp, aux) if aux is not None else gx2[:, :0]
    if where == "cpu":
        _cpu[activation, "backward"](g2, s2, aux2, gx2, gx2[0, :0] if gb is None else gb, c)
    else:
        kernels = _cuda_kernels()
        launch(kernels["backward"], g2.size, g2, s2, aux2, gx2, kind, c, stream_of=g)
        if gb is not None:
            launch(kernels["column_sums"], m, gx2, gb, stream_of=g)
    return gx, gb


def warmup(dtype, activations=tuple(ACTIVATIONS)):
    """Compile the CPU kernels of ``activations`` for ``dtype``."""
    x, b = np.ones((2, 3), dtype), np.ones(3, dtype)
    for name in activations:
        out, saved = forward(x.copy(), b, name, inplace=True)
        backward(out, saved, name, bias_grad=True)
        forward(x, None, name)
