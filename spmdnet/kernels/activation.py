"""Bias + activation in one pass, forward and backward.

The fused linear layer (``ops.linalg.LinearAct``) runs ``activation(x @ W.T
+ b)`` as one product and one pass of ``forward`` over its fresh output (in
place for relu); one pass of ``backward`` gives the gradient before the
activation and the bias gradient (column sums in row order: the bits of
NumPy's ``sum(axis=0)``). The gelu ops use them without bias.

What is saved works with the xp reference (``ops.unary.act_forward`` and
``act_backward``) too: the output for sigmoid; for relu the output (xp) or
the mask of live units, not (output <= 0) (a quarter of the bytes); (input, Φ(input)) for gelu,
(input, tanh(...)) for gelu_tanh. Which ops use them: dispatch.py. tanh
and sigmoid forward and tanh backward have no kernel: NumPy's own loops are
as fast. The relu op's out-of-place forward is a kernel: NumPy 2.4's
``maximum`` (NaN-propagating) runs at a third of a plain copy's speed (0.17
against 0.04 ms on ResNet's 2 MB activation, 1 thread), and a masked
backward in NumPy makes the mask first.
"""
import functools
import math

import numpy as np

from ..backend import xp_of
from . import reduce, special
from ._cpu import CpuKernel
from ._numba import njit_inline, prange
from ._target import check_target

# The steps that have kernels, each reached from a row of dispatch.TABLE: the
# fused linear layer's forward in place over the product (relu, gelu,
# gelu_tanh), the gelu ops' forward, and backward (sigmoid's: the fused layer's).
FORWARD_INPLACE = ("relu", "gelu", "gelu_tanh")
FORWARD = ("relu", "gelu", "gelu_tanh")
BACKWARD = ("relu", "gelu", "gelu_tanh", "sigmoid")
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
    # NaN and -0.0 pass, as PyTorch's relu; the mask is "not dead" (True at NaN),
    # so the gradient passes at a NaN input, as PyTorch's does
    return (c[0] if v < c[0] else v), not (v <= c[0])


@njit_inline
def _relu_grad(g, y, aux, c):
    # y: the output, or the mask; select, not multiply: a dead unit gives 0 even
    # where g is inf or NaN (0 * inf is NaN), and a NaN output passes g, as PyTorch
    return c[0] if y <= c[0] else g


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
def _sigmoid_grad(g, y, aux, c):
    return g * y * (c[1] - y)


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
    call with a constant store_pre (a variable one stopped LLVM vectorising)."""
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


def _relu_forward(x, out, c):
    """out = relu(x) over 1-D arrays (one long loop: image rows can be 4 long)."""
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = c[0] if v < c[0] else v


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


def _relu_backward(g, saved, aux, gx, gb, c):
    _grad_rows(g, saved, aux, gx, gb, False, _relu_grad, c)


def _gelu_backward(g, saved, aux, gx, gb, c):
    _grad_rows(g, saved, aux, gx, gb, True, _gelu_grad, c)


def _gelu_tanh_backward(g, saved, aux, gx, gb, c):
    _grad_rows(g, saved, aux, gx, gb, True, _gelu_tanh_grad, c)


def _sigmoid_backward(g, saved, aux, gx, gb, c):
    _grad_rows(g, saved, aux, gx, gb, False, _sigmoid_grad, c)


_cpu = {("relu", "forward_inplace"): CpuKernel(_relu_forward_inplace),
        ("relu", "forward"): CpuKernel(_relu_forward),
        ("gelu", "forward"): CpuKernel(_gelu_forward),
        ("gelu_tanh", "forward"): CpuKernel(_gelu_tanh_forward),
        ("relu", "backward"): CpuKernel(_relu_backward),
        ("gelu", "backward"): CpuKernel(_gelu_backward),
        ("gelu_tanh", "backward"): CpuKernel(_gelu_tanh_backward),
        ("sigmoid", "backward"): CpuKernel(_sigmoid_backward)}


def _check_step(activation, names, step):
    if activation not in names:
        raise ValueError(f"activation must be one of {list(names)} for the {step} "
                         f"kernels, got {activation!r}")


def forward(x, bias=None, activation="relu", inplace=False):
    """``(out, saved)``: out = activation(x + bias) over the last axis, and
    what ``backward`` (or ``ops.unary.act_backward``) needs.

    ``inplace=True`` says x is a fresh C-contiguous buffer the caller owns
    (a product's output): out is x itself for relu, and for gelu x receives
    x + bias (``FORWARD_INPLACE``). Otherwise x is left untouched
    (``FORWARD``: the relu and gelu ops; relu saves its output)."""
    _check_step(activation, FORWARD_INPLACE if inplace else FORWARD,
                "in-place forward" if inplace else "forward")
    check_target("activation", x, bias)
    if bias is not None and bias.shape != x.shape[-1:]:
        raise ValueError(f"bias of shape {bias.shape} does not match the last axis of "
                         f"the input {x.shape}")
    if inplace and not x.flags.c_contiguous:
        raise ValueError("inplace=True needs a C-contiguous input")
    xp = xp_of(x)
    b = bias if bias is not None else xp.empty(0, x.dtype)
    b = b if b.flags.c_contiguous else xp.ascontiguousarray(b)
    c = _constants(x.dtype)
    if activation == "relu" and inplace:  # saves a boolean mask not (out <= 0): backward
        # then streams 1 byte per element instead of 4 (act_backward accepts it too)
        mask = xp.empty(x.shape, np.bool_)
        if x.size:
            x2 = reduce.rows(xp, x)
            _cpu["relu", "forward_inplace"](x2, b, mask.reshape(x2.shape), c)
        return x, mask
    if activation == "relu":  # out of place (the relu op): saves the output
        out = xp.empty(x.shape, x.dtype)
        if x.size:
            x2 = reduce.rows(xp, x)
            x2 = x2 + b if bias is not None else x2
            _cpu["relu", "forward"](x2.reshape(-1), out.reshape(-1), c)
        return out, out
    out, aux = xp.empty(x.shape, x.dtype), xp.empty(x.shape, x.dtype)  # gelu, gelu_tanh
    if x.size == 0:
        return out, (x, aux)
    x2 = reduce.rows(xp, x)
    store_pre = inplace and bias is not None
    if bias is not None and not inplace:  # x + bias needs a home of its own
        x2, b = x2 + b, b[:0]
    _cpu[activation, "forward"](x2, b, out.reshape(x2.shape), aux.reshape(x2.shape),
                                store_pre, c)
    return out, (x2.reshape(x.shape), aux)


def backward(g, saved, activation="relu", bias_grad=False, bias_out=None):
    """``(gx, gb)``: the gradient before the activation, from ``forward``'s
    saved (or ``ops.unary.act_forward``'s), and (with ``bias_grad``) its sum
    over all but the last axis, written into ``bias_out`` when given (a
    gradient buffer), else new."""
    _check_step(activation, BACKWARD, "backward")
    s, aux = saved if activation in SAVES_INPUT else (saved, None)
    mask = s.dtype == np.bool_
    if mask and activation != "relu":
        raise TypeError(f"a boolean saved array is relu's mask, not {activation}'s")
    check_target("activation", g, None if mask else s, aux, bias_out)
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
    # no column sums: one long row (image rows can be 4 long)
    shape = (-1, m) if gb is not None else (1, -1)
    g2, s2 = reduce.rows(xp, g).reshape(shape), reduce.rows(xp, s).reshape(shape)
    gx2 = gx.reshape(shape)
    aux2 = reduce.rows(xp, aux).reshape(shape) if aux is not None else gx2[:, :0]
    _cpu[activation, "backward"](g2, s2, aux2, gx2, gx2[0, :0] if gb is None else gb, c)
    return gx, gb


def warmup(dtype, activations=BACKWARD):
    """Compile the CPU kernels of ``activations`` for ``dtype``."""
    x, b = np.ones((2, 3), dtype), np.ones(3, dtype)
    for name in activations:
        if name in FORWARD_INPLACE:
            forward(x.copy(), b, name, inplace=True)
        if name in FORWARD:
            forward(x, None, name)
        saved = (x, x) if name in SAVES_INPUT else x
        backward(x, saved, name, bias_grad=True)
