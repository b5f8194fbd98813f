"""Layer normalisation over the last axis, and batch normalisation over
every axis but the channel axis 1, forward and backward.

Layer norm: one pass over each row (plus reductions that stay in the L1
cache).

Forward saves the row means and reciprocal standard deviations (N,), not
the normalised input (N, D); backward recomputes it from the input. The
weight and bias gradients accumulate row by row (deterministic). The
plain-xp reference is ``spmdnet.ops.nn_ops.LayerNorm``.

Batch norm's kernels live in ``batch_norm`` and are re-exported here (the
dispatch TABLE's "batch_norm" row names them as ``norm.*``).
"""
import math

import numpy as np

from ..backend import xp_of
from . import reduce
from .batch_norm import (batch_backward, batch_grad_sums, batch_input_grad, batch_moments,
                         batch_normalize, batch_takes)
from .batch_norm import warmup as _batch_norm_warmup
from ._cpu import CpuKernel
from ._numba import njit_inline, prange
from ._target import check_target

__all__ = ["forward", "backward", "warmup", "batch_moments", "batch_normalize",
           "batch_grad_sums", "batch_input_grad", "batch_backward", "batch_takes"]


def _forward(x, weight, bias, out, mean, rstd, c):
    """out = (x - mean) * rstd * weight + bias per row (weight/bias may be
    empty); c = (0, 1, D, eps) in x's dtype."""
    affine = weight.shape[0] > 0
    zero, one, d, eps = c
    for i in prange(x.shape[0]):
        mu = reduce.row_sum(x, i, zero) / d
        for j in range(x.shape[1]):
            out[i, j] = x[i, j] - mu
        r = one / math.sqrt(reduce.row_dot(out, i, out, i, zero) / d + eps)
        mean[i] = mu
        rstd[i] = r
        if affine:
            for j in range(x.shape[1]):
                out[i, j] = out[i, j] * r * weight[j] + bias[j]
        else:
            for j in range(x.shape[1]):
                out[i, j] = out[i, j] * r


def _backward(g, x, weight, mean, rstd, gx, gw, gb, xhat, c):
    """gx of the layer norm; with a weight also gw = sum of g * xhat and
    gb = sum of g over rows (both always computed: the caller gives scratch
    rows for one not wanted). xhat is a (1, D) scratch row; c as in _forward."""
    if weight.shape[0] > 0:  # constant flags: a flag tested per element stops vectorising
        _backward_rows(g, x, weight, mean, rstd, gx, gw, gb, xhat, True, c)
    else:
        _backward_rows(g, x, weight, mean, rstd, gx, gw, gb, xhat, False, c)


@njit_inline
def _backward_rows(g, x, weight, mean, rstd, gx, gw, gb, xhat, affine, c):
    zero, d = c[0], c[2]
    for j in range(gw.shape[0]):
        gw[j] = zero
        gb[j] = zero
    for i in range(x.shape[0]):  # serial: gw and gb accumulate in row order
        mu, r = mean[i], rstd[i]
        for j in range(x.shape[1]):
            xh = (x[i, j] - mu) * r
            xhat[0, j] = xh
            if affine:
                gx[i, j] = g[i, j] * weight[j]
                gw[j] += g[i, j] * xh
                gb[j] += g[i, j]
            else:
                gx[i, j] = g[i, j]
        a = reduce.row_sum(gx, i, zero) / d
        b = reduce.row_dot(gx, i, xhat, 0, zero) / d
        for j in range(x.shape[1]):
            gx[i, j] = r * (gx[i, j] - a - xhat[0, j] * b)


_cpu = {"forward": CpuKernel(_forward), "backward": CpuKernel(_backward)}


def _constants(dtype, d, eps):
    return tuple(dtype.type(v) for v in (0.0, 1.0, d, eps))


def _affine(xp, x, weight, bias):
    if (weight is None) != (bias is None):
        raise ValueError("layer_norm kernels: give both weight and bias, or neither")
    if weight is None:
        empty = xp.empty(0, x.dtype)
        return empty, empty
    if weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
        raise ValueError(f"layer_norm kernels: weight {weight.shape} and bias {bias.shape} "
                         f"must match the last axis of the input {x.shape}")
    return xp.ascontiguousarray(weight), xp.ascontiguousarray(bias)


def forward(x, weight=None, bias=None, eps=1e-5):
    """``(out, mean, rstd)`` of layer norm over the last axis; mean and rstd
    have x's shape without its last axis."""
    check_target("layer_norm", x, weight, bias)
    if x.ndim == 0:
        raise ValueError("layer_norm kernels: the input needs at least one axis")
    xp = xp_of(x)
    w, b = _affine(xp, x, weight, bias)
    out = xp.empty(x.shape, x.dtype)
    mean, rstd = xp.empty(x.shape[:-1], x.dtype), xp.empty(x.shape[:-1], x.dtype)
    if x.size == 0:
        return out, mean, rstd
    x2 = reduce.rows(xp, x)
    args = (x2, w, b, out.reshape(x2.shape), mean.reshape(-1), rstd.reshape(-1),
            _constants(x.dtype, x.shape[-1], eps))
    _cpu["forward"](*args)
    return out, mean, rstd


def backward(g, x, weight, mean, rstd, want_weight=True, want_bias=True, weight_out=None,
             bias_out=None):
    """``(gx, gw, gb)`` from ``forward``'s mean and rstd; gw and gb (None
    unless wanted, or without a weight) are written into ``weight_out`` and
    ``bias_out`` when given (gradient buffers)."""
    check_target("layer_norm", g, x, weight, mean, rstd)
    if g.shape != x.shape or mean.shape != x.shape[:-1] or rstd.shape != mean.shape:
        raise ValueError(f"layer_norm kernels: gradient {g.shape}, input {x.shape}, mean "
                         f"{mean.shape}, rstd {rstd.shape} do not fit")
    xp = xp_of(x)
    d = x.shape[-1]
    w = xp.empty(0, x.dtype) if weight is None else xp.ascontiguousarray(weight)
    if weight is not None and w.shape != (d,):
        raise ValueError(f"layer_norm kernels: weight {weight.shape} != ({d},)")
    affine = weight is not None

    def param_grad(wanted, dest):
        if not (affine and wanted):
            return None
        if dest is not None and (dest.shape != (d,) or not dest.flags.c_contiguous):
            raise ValueError(f"layer_norm kernels: gradient buffer {dest.shape} != ({d},)")
        return dest if dest is not None else xp.empty(d, x.dtype)

    gw, gb = param_grad(want_weight, weight_out), param_grad(want_bias, bias_out)
    gx = xp.empty(x.shape, x.dtype)
    if x.size == 0:
        for p in (gw, gb):
            if p is not None:
                p[...] = 0
        return gx, gw, gb
    g2, x2, gx2 = reduce.rows(xp, g), reduce.rows(xp, x), gx.reshape(-1, d)
    m1, r1 = xp.ascontiguousarray(mean).reshape(-1), xp.ascontiguousarray(rstd).reshape(-1)
    # with a weight the kernels compute both sums: a scratch row for one not wanted
    gw1, gb1 = (a if a is not None else xp.empty(d if affine else 0, x.dtype) for a in (gw, gb))
    _cpu["backward"](g2, x2, w, m1, r1, gx2, gw1, gb1, np.empty((1, d), x.dtype),
                     _constants(x.dtype, d, 0.0))
    return gx, gw, gb


def warmup(dtype):
    """Compile the CPU kernels for ``dtype`` (layer norm affine and not; batch norm)."""
    x, w = np.ones((2, 3), dtype), np.ones(3, dtype)
    for weight in (w, None):
        out, mean, rstd = forward(x, weight, None if weight is None else w)
        backward(out, x, weight, mean, rstd)
    _batch_norm_warmup(dtype)
