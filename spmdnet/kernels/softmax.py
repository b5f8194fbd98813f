"""Softmax over the last axis, forward and backward, one row at a time.

NumPy's ``x.max(axis=-1)`` and ``e.sum(axis=-1)`` over short rows (the
attention scores of minGPT: rows of T = 64) pay their per-row loop overhead
and four full passes with temporaries; here forward is one pass for the max,
one for exp and the sum, one to scale, all while the row is in L1, and
backward is ``y * (g - sum(g * y))`` in one pass per row. A row of -inf
gives NaN (0 * inf), as the xp reference and PyTorch. The plain-xp
reference is ``spmdnet.ops.nn_ops.Softmax``.
"""
import functools
import math

import numpy as np

from ..backend import xp_of
from . import reduce, special
from ._cpu import CpuKernel
from ._numba import prange
from ._target import check_target

def _forward(x, out, lse, c):
    """out[i] = exp(x[i] - m) / s and lse[i] = m + log(s), with m = max(x[i])
    and s = sum(exp(x[i] - m)); c = (0, 1, -inf)."""
    zero, one, neg_inf = c
    for i in prange(x.shape[0]):
        m = reduce.row_max(x, i, neg_inf)
        for j in range(x.shape[1]):
            out[i, j] = special.exp(x[i, j] - m)
        total = reduce.row_sum(out, i, zero)
        lse[i] = m + math.log(total)
        inv = one / total
        for j in range(x.shape[1]):
            out[i, j] *= inv


def _from_lse(x, out, lse, c):
    """out[i] = exp(x[i] - lse[i]): the softmax again from its log-sum-exp."""
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = special.exp(x[i, j] - lse[i])


def _backward(g, y, gx, c):
    """gx[i] = y[i] * (g[i] - sum(g[i] * y[i]))."""
    zero = c[0]
    for i in prange(g.shape[0]):
        dot = reduce.row_dot(g, i, y, i, zero)
        for j in range(g.shape[1]):
            gx[i, j] = y[i, j] * (g[i, j] - dot)


_cpu = {"forward": CpuKernel(_forward), "backward": CpuKernel(_backward),
        "from_lse": CpuKernel(_from_lse)}


@functools.lru_cache
def constants(dtype):
    """``(0, 1, -inf)`` in ``dtype``, the row kernels' ``c`` (also cross-entropy's)."""
    return tuple(dtype.type(v) for v in (0.0, 1.0, -np.inf))


def _run(step, arrays, out, lse=None):
    rows = arrays[0]
    more = () if lse is None else (lse.reshape(-1),)
    _cpu[step](*arrays, out.reshape(rows.shape), *more, constants(rows.dtype))
    return out


def forward(x):
    """softmax(x) over the last axis (x has at least one axis)."""
    return forward_lse(x)[0]


def forward_lse(x):
    """``(softmax(x), logsumexp(x))`` over the last axis; the second has x's
    shape without its last axis (scaled dot-product attention keeps it)."""
    check_target("softmax", x)
    if x.ndim == 0:
        raise ValueError("softmax kernels: the input needs at least one axis")
    xp = xp_of(x)
    out, lse = xp.empty(x.shape, x.dtype), xp.empty(x.shape[:-1], x.dtype)
    if x.size:
        _run("forward", (reduce.rows(xp, x),), out, lse)
    return out, lse


def from_lse(x, lse):
    """exp(x - lse[..., None]): the softmax of x again, from ``forward_lse``'s
    log-sum-exp (or any row statistic of x's shape without its last axis)."""
    check_target("softmax", x, lse)
    if lse.shape != x.shape[:-1]:
        raise ValueError(f"softmax kernels: lse {lse.shape} does not fit x {x.shape}")
    xp = xp_of(x)
    out = xp.empty(x.shape, x.dtype)
    if x.size:
        _run("from_lse", (reduce.rows(xp, x),), out, xp.ascontiguousarray(lse))
    return out


def backward(g, y):
    """The gradient of softmax at output ``y`` for the output gradient ``g``."""
    check_target("softmax", g, y)
    if g.shape != y.shape:
        raise ValueError(f"softmax kernels: gradient {g.shape} and output {y.shape} differ")
    xp = xp_of(g)
    gx = xp.empty(g.shape, y.dtype)
    if g.size == 0:
        return gx
    return _run("backward", (reduce.rows(xp, g), reduce.rows(xp, y)), gx)


def warmup(dtype):
    """Compile the CPU kernels for ``dtype``."""
    x = np.zeros((2, 3), dtype)
    y, lse = forward_lse(x)
    backward(x, y)
    from_lse(x, lse)
