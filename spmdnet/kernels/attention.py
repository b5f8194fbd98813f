"""Scaled dot-product attention one query row (forward, dq) or one key row
(dk, dv) at a time, flash-attention style: an online softmax accumulates
straight into the output row, nothing of size L x S is ever stored, and
backward recomputes the probabilities from the saved log-sum-exp row
statistic. Causal masking (top-left aligned, as PyTorch) is a loop bound.

Dropout keeps element (n, i, j) of the (N, L, S) probabilities when the
first word of Philox4x32-10 at counter n*L*S + i*S + j is at least
``threshold(p)``: ``philox`` is one plain body, run on NumPy or CuPy arrays
by the xp path (``dropout_keep``) and compiled for the kernels, so both
regenerate the same mask in backward instead of storing it. The plain-xp
reference is ``spmdnet.ops.attention.ScaledDotProductAttention``.
"""
import math

import numpy as np

from ..backend import xp_of
from ._cpu import CpuKernel
from ._cuda import Builder, launch
from ._numba import njit_inline, prange
from ._target import check_target

cuda = None  # numba.cuda, bound by _cuda.Builder (the CUDA simulator swaps this global)

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
LOW, S32 = np.uint64(0xFFFFFFFF), np.uint64(32)


def philox(index, k0, k1):
    """The first 32-bit word of Philox4x32-10 at counter (index's low and
    high words, 0, 0) with key (k0, k1); uint64 scalars or arrays."""
    c0, c1 = index & LOW, index >> S32
    c2 = c3 = c0 ^ c0
    for _ in range(10):
        p0, p1 = c0 * M0, c2 * M1
        c0, c1, c2, c3 = (p1 >> S32) ^ c1 ^ k0, p1 & LOW, (p0 >> S32) ^ c3 ^ k1, p0 & LOW
        k0, k1 = (k0 + W0) & LOW, (k1 + W1) & LOW
    return c0


_philox = njit_inline(philox)


def keys(seed):
    """Philox's key words from a 64-bit seed."""
    return np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)


def threshold(p):
    """Words below this are dropped: probability p (1.0 drops everything)."""
    return np.uint64(min(round(p * 2.0**32), 2**32))


def dropout_keep(xp, shape, rows, seed, p):
    """The bool keep mask of rows ``rows`` (a range) of the (N, L, S) probabilities."""
    n, length, source = shape
    u = np.uint64
    index = ((xp.arange(n, dtype=u)[:, None, None] * u(length)
              + xp.arange(rows.start, rows.stop, dtype=u)[None, :, None]) * u(source)
             + xp.arange(source, dtype=u))
    k0, k1 = keys(seed)
    return philox(index, k0, k1) >= threshold(p)


def _dropout_rows(factors, first_row, length, drop, inv_keep, k0, k1):
    """factors[n, r, j] = inv_keep where element (n, first_row + r, j) of
    the (N, length, S) probabilities is kept, else 0 (dropout_keep's mask,
    scaled, without its dozens of uint64 array passes)."""
    source = factors.shape[2]
    zero = inv_keep - inv_keep  # 0 in the factors' dtype
    for n in prange(factors.shape[0]):
        for r in range(factors.shape[1]):
            base = (n * length + first_row + r) * source
            for j in range(source):
                keep = _philox(np.uint64(base + j), k0, k1) >= drop
                factors[n, r, j] = inv_keep if keep else zero


_dropout_kernel = CpuKernel(_dropout_rows)


def dropout_factors(shape, rows, seed, p, dtype):
    """The kept-and-scaled factors (0 or 1 / (1 - p)) of rows ``rows`` of
    the (N, L, S) probabilities, as ``dropout_keep`` decides, on the CPU."""
    n, length, source = shape
    factors = np.empty((n, len(rows), source), dtype)
    inv = dtype.type(0.0 if p >= 1 else 1.0 / (1.0 - p))
    k0, k1 = keys(seed)
    if factors.size:
        _dropout_kernel(factors, rows.start, length, threshold(p), inv, k0, k1)
    return factors


@njit_inline
def _kept(n, i, j, length, source, drop, k0, k1):
    return _philox(np.uint64((n * length + i) * source + j), k0, k1) >= drop


@njit_inline
def _dot(a, n, i, b, j):
    s = 0.0
    for e in range(a.shape[2]):
        s += a[n, i, e] * b[n, j, e]
    return s


@njit_inline
def _forward_row(q, k, v, out, lse, n, i, causal, scale, inv_keep, drop, k0, k1):
    """out[n, i] and lse[n, i]: one pass over the keys (online softmax)."""
    length, source, ev = q.shape[1], k.shape[1], v.shape[2]
    end = min(i + 1, source) if causal else source
    m, total = -math.inf, 0.0
    for e in range(ev):
        out[n, i, e] = 0.0
    for j in range(end):
        s = _dot(q, n, i, k, j) * scale
        if s > m:
            r = math.exp(m - s)
            total *= r
            for e in range(ev):
                out[n, i, e] *= r
            m = s
        p = math.exp(s - m)
        total += p
        if drop > 0:
            if not _kept(n, i, j, length, source, drop, k0, k1):
                continue
            p *= inv_keep
        for e in range(ev):
            out[n, i, e] += p * v[n, j, e]
    for e in range(ev):
        out[n, i, e] /= total
    lse[n, i] = m + math.log(total)


@njit_inline
def _probability(q, k, g, v, lse, dsum, n, i, j, scale, inv_keep, drop, k0, k1):
    """(p, p with dropout, dscore / scale) of score (n, i, j), recomputed."""
    p = math.exp(_dot(q, n, i, k, j) * scale - lse[n, i])
    dp, pd = _dot(g, n, i, v, j), p
    if drop > 0:
        if _kept(n, i, j, q.shape[1], k.shape[1], drop, k0, k1):
            dp, pd = dp * inv_keep, p * inv_keep
        else:
            dp, pd = 0.0, 0.0
    return p, pd, p * (dp - dsum[n, i])


@njit_inline
def _dq_row(q, k, v, g, lse, dsum, dq, n, i, causal, scale, inv_keep, drop, k0, k1):
    source = k.shape[1]
    for e in range(q.shape[2]):
        dq[n, i, e] = 0.0
    for j in range(min(i + 1, source) if causal else source):
        ds = _probability(q, k, g, v, lse, dsum, n, i, j, scale, inv_keep, drop, k0, k1)[2]
        for e in range(q.shape[2]):
            dq[n, i, e] += ds * scale * k[n, j, e]


@njit_inline
def _dkv_row(q, k, v, g, lse, dsum, dk, dv, n, j, causal, scale, inv_keep, drop, k0, k1):
    for e in range(k.shape[2]):
        dk[n, j, e] = 0.0
    for e in range(v.shape[2]):
        dv[n, j, e] = 0.0
    for i in range(j if causal else 0, q.shape[1]):
        _, pd, ds = _probability(q, k, g, v, lse, dsum, n, i, j, scale, inv_keep, drop,
                                 k0, k1)
        for e in range(v.shape[2]):
            dv[n, j, e] += pd * g[n, i, e]
        for e in range(k.shape[2]):
            dk[n, j, e] += ds * scale * q[n, i, e]


def _forward(q, k, v, out, lse, causal, scale, inv_keep, drop, k0, k1):
    length = q.shape[1]
    for r in prange(q.shape[0] * length):
        _forward_row(q, k, v, out, lse, r // length, r % length, causal, scale, inv_keep,
                     drop, k0, k1)


def _backward(q, k, v, g, lse, dsum, dq, dk, dv, causal, scale, inv_keep, drop, k0, k1):
    length, source = q.shape[1], k.shape[1]
    for r in prange(q.shape[0] * length):
        _dq_row(q, k, v, g, lse, dsum, dq, r // length, r % length, causal, scale, inv_keep,
                drop, k0, k1)
    for r in prange(q.shape[0] * source):
        _dkv_row(q, k, v, g, lse, dsum, dk, dv, r // source, r % source, causal, scale,
                 inv_keep, drop, k0, k1)


_cpu = {"forward": CpuKernel(_forward), "backward": CpuKernel(_backward)}


@Builder
def _cuda_kernels():
    """One thread per query row (forward, dq) or key row (dk, dv)."""
    def forward(q, k, v, out, lse, causal, scale, inv_keep, drop, k0, k1):
        r = cuda.grid(1)
        if r < q.shape[0] * q.shape[1]:
            _forward_row(q, k, v, out, lse, r // q.shape[1], r % q.shape[1], causal, scale,
                         inv_keep, drop, k0, k1)

    def dq(q, k, v, g, lse, dsum, gq, causal, scale, inv_keep, drop, k0, k1):
        r = cuda.grid(1)
        if r < q.shape[0] * q.shape[1]:
            _dq_row(q, k, v, g, lse, dsum, gq, r // q.shape[1], r % q.shape[1], causal,
                    scale, inv_keep, drop, k0, k1)

    def dkv(q, k, v, g, lse, dsum, dk, dv, causal, scale, inv_keep, drop, k0, k1):
        r = cuda.grid(1)
        if r < k.shape[0] * k.shape[1]:
            _dkv_row(q, k, v, g, lse, dsum, dk, dv, r // k.shape[1], r % k.shape[1], causal,
                     scale, inv_keep, drop, k0, k1)

    return {"forward": forward, "dq": dq, "dkv": dkv}


def _prepare(what, q, k, v, *more):
    where = check_target(what, q, k, v, *more)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or k.shape[:2] != v.shape[:2] \
            or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"{what} kernels: q (N, L, E), k (N, S, E), v (N, S, Ev) expected, "
                         f"got {q.shape}, {k.shape}, {v.shape}")
    xp = xp_of(q, k, v)
    return where, xp, [xp.ascontiguousarray(a) for a in (q, k, v, *more)]


def _constants(dtype, causal, scale, dropout_p, seed):
    inv_keep = 0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p)
    drop = threshold(dropout_p) if dropout_p > 0 else np.uint64(0)
    return (bool(causal), dtype.type(scale), dtype.type(inv_keep), drop, *keys(seed))


def forward(q, k, v, causal=False, scale=1.0, dropout_p=0.0, seed=0):
    """``(out, lse)``: attention of q (N, L, E) over k (N, S, E), v (N, S, Ev),
    and the log-sum-exp of each row's scores (N, L)."""
    where, xp, (q, k, v) = _prepare("attention", q, k, v)
    n, length = q.shape[:2]
    out, lse = xp.empty((n, length, v.shape[2]), q.dtype), xp.empty((n, length), q.dtype)
    args = (q, k, v, out, lse) + _constants(q.dtype, causal, scale, dropout_p, seed)
    if where == "cpu":
        _cpu["forward"](*args)
    else:
        launch(_cuda_kernels()["forward"], n * length, *args, stream_of=q)
    return out, lse


def backward(g, q, k, v, out, lse, causal=False, scale=1.0, dropout_p=0.0, seed=0):
    """``(dq, dk, dv)`` from forward's output and lse, the same dropout mask
    regenerated from ``seed``."""
    where, xp, (q, k, v, g, out, lse) = _prepare("attention", q, k, v, g, out, lse)
    dsum = (g * out).sum(axis=-1)
    dq, dk, dv = xp.empty_like(q), xp.empty_like(k), xp.empty_like(v)
    consts = _constants(q.dtype, causal, scale, dropout_p, seed)
    if where == "cpu":
        _cpu["backward"](q, k, v, g, lse, dsum, dq, dk, dv, *consts)
    else:
        kernels = _cuda_kernels()
        launch(kernels["dq"], q.shape[0] * q.shape[1], q, k, v, g, lse, dsum, dq, *consts,
               stream_of=q)
        launch(kernels["dkv"], k.shape[0] * k.shape[1], q, k, v, g, lse, dsum, dk, dv,
               *consts, stream_of=q)
    return dq, dk, dv


def warmup(dtype):
    """Compile for ``dtype`` the kernel dispatch.TABLE gives the ops: the
    dropout factors (the row kernels above, which no row takes, compile at
    a first forced use)."""
    dropout_factors((1, 2, 2), range(2), 0, 0.5, np.dtype(dtype))
