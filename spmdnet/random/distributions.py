"""PyTorch's CPU sampling transforms over a ``Generator``'s stream, each
drawing exactly the raw numbers PyTorch's kernel draws, in its order.

float32 uniforms take 24 bits of one 32-bit draw, float64 ones 53 bits of a
64-bit draw; integers in ``[low, high)`` take ``low + draw % range`` (a 64-bit
draw once the range reaches 2**32). Normals: 16 or more values fill the
tensor with uniforms and turn each block of 16 into normals by Box-Muller
(first 8 as radii, last 8 as angles); a ragged tail redoes the last 16 with
fresh uniforms. Fewer than 16 values are drawn one at a time in float64, each
pair giving two normals, the second kept for the next call. Scalar-p
Bernoulli, the exponential family and multinomial use float64 uniforms;
tensor-p Bernoulli float32 ones. The float64 transforms call the C library's
``log``/``log1p``/``cos``/``sin`` (through Numba, or ``math`` without it) as
PyTorch does, so they are bitwise; float32 normals follow PyTorch's
vectorised kernel (``compiled32``, ``float32_math``).
"""
import math

import numpy as np

from . import compiled, compiled32


def _size(shape):
    return int(np.prod(shape, dtype=np.int64))


def _native(dtype):
    """The dtype PyTorch's transforms run in (other floats: float32, then cast)."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def uniform(g, shape, low, high, dtype):
    """``uniform_(low, high)``: ``u * (high - low) + low`` in the tensor's dtype."""
    native = _native(dtype)
    lo, hi = native.type(low), native.type(high)
    if native == np.float64:
        out = compiled.fma_array(g.uniform01(_size(shape), native), hi - lo, lo)
    else:
        out = compiled32.uniform_float32(g.random32(_size(shape)), lo, hi - lo)
    return out.reshape(shape).astype(dtype, copy=False)


def _scalar_normals(g, n, mean, std):
    """``n`` normals one at a time (float64): a cached value first, then one
    Box-Muller pair per two float64 uniforms, an unused second value cached."""
    out = np.empty(n, np.float64)
    first = 0
    if n and g.next_normal is not None:
        out[0], g.next_normal, first = compiled.fma(g.next_normal, std, mean), None, 1
    pairs = (n - first + 1) // 2
    if pairs:
        pair_values = compiled.box_muller_pairs(g.uniform01(2 * pairs, np.float64), mean, std)
        out[first:] = pair_values[:n - first]
        if (n - first) % 2:
            g.next_normal = float(pair_values[-1])
    return out


def _fill_normals(block, mean, std, native):
    if native == np.float64:
        compiled.box_muller_float64(block, float(mean), float(std))
    else:
        compiled32.box_muller_float32(block, mean, std)


def normal(g, shape, mean, std, dtype):
    """``normal_(mean, std)`` over a contiguous tensor of ``shape``."""
    n, native = _size(shape), _native(dtype)
    if n < 16:
        out = _scalar_normals(g, n, float(mean), float(std)).astype(native)
    else:
        out = g.uniform01(n, native)
        _fill_normals(out, mean, std, native)
        if n % 16:
            tail = g.uniform01(16, native)
            _fill_normals(tail, mean, std, native)
            out[n - 16:] = tail
    return out.reshape(shape).astype(dtype, copy=False)


def log_normal(g, shape, mean, std, dtype):
    """``log_normal_``: exp of one-at-a-time normals (every size)."""
    values = compiled.exp_array(_scalar_normals(g, _size(shape), float(mean), float(std)))
    return values.reshape(shape).astype(dtype)


def random_from_to(g, shape, low, high):
    """``random_(low, high)`` / ``randint``: int64 in ``[low, high)``."""
    span, n = int(high) - int(low), _size(shape)
    raw = g.random64(n) if span >= 2**32 else g.random32(n)
    return ((raw % np.uint64(span)).astype(np.int64) + np.int64(low)).reshape(shape)


_FULL_RANGE = {np.dtype(np.int64): 2**63, np.dtype(np.int32): 2**31, np.dtype(np.int16): 2**15,
               np.dtype(np.int8): 2**7, np.dtype(np.uint8): 2**8, np.dtype(np.bool_): 2,
               np.dtype(np.float64): 2**53 + 1, np.dtype(np.float32): 2**24 + 1}


def random_full(g, shape, dtype):
    """``random_()``: ``draw % (max + 1)`` over the dtype's exact integers
    (a 64-bit draw for int64 and float64)."""
    dtype = np.dtype(dtype)
    if dtype not in _FULL_RANGE:
        raise TypeError(f"random_() is not implemented for dtype {dtype}")
    n = _size(shape)
    raw = g.random64(n) if dtype in (np.int64, np.float64) else g.random32(n)
    return (raw % np.uint64(_FULL_RANGE[dtype])).astype(dtype).reshape(shape)


def randperm(g, n):
    """PyTorch's ``randperm(n)``: Fisher-Yates from 32-bit draws (64-bit ones
    for n of 2**32 / 20 or more)."""
    perm = np.arange(n, dtype=np.int64)
    if n > 1:
        draws = g.random32(n - 1) if n < 2**32 // 20 else g.random64(n - 1)
        compiled.fisher_yates(perm, draws.astype(np.int64) if n < 2**32 // 20 else draws)
    return perm


def bernoulli_scalar(g, shape, p, dtype):
    """``bernoulli_(p)`` with a number ``p``: ``u < p``, u a float64 uniform.
    As u = m·2^-53 (m the draw's low 53 bits) exactly, for 0 <= p <= 1 that
    is m < ceil(p·2^53): one integer compare, no uniforms made."""
    p = float(p)
    if not 0.0 <= p <= 1.0:  # NaN too: the float compare
        return (g.uniform01(_size(shape), np.float64) < p).reshape(shape).astype(dtype)
    low53 = g.random64(_size(shape)) & np.uint64(2**53 - 1)
    return (low53 < np.uint64(math.ceil(math.ldexp(p, 53)))).reshape(shape).astype(dtype)


def bernoulli_tensor(g, p, dtype):
    """``bernoulli(p)`` with a tensor of probabilities: ``u < p`` elementwise,
    u a uniform of p's dtype (float32 for other dtypes)."""
    p = np.asarray(p)
    native = _native(p.dtype)
    u = g.uniform01(p.size, native).reshape(p.shape)
    return (u < p.astype(native)).astype(dtype)


def exponential(g, shape, lambd, dtype):
    """``exponential_(lambd)``: ``-1/lambd * log1p(-u)``."""
    u = g.uniform01(_size(shape), np.float64)
    return compiled.scaled_log1p_neg(u, -1.0 / float(lambd)).reshape(shape).astype(dtype)


def geometric(g, shape, p, dtype):
    """``geometric_(p)``: ``ceil(log(u) / log1p(-p))``."""
    u = g.uniform01(_size(shape), np.float64)
    return np.ceil(compiled.log_array(u) / math.log1p(-float(p))).reshape(shape).astype(dtype)


def cauchy(g, shape, median, sigma, dtype):
    """``cauchy_(median, sigma)``: ``median + sigma * tan(pi * (u - 0.5))``."""
    u = g.uniform01(_size(shape), np.float64)
    return compiled.cauchy_array(u, float(median), float(sigma)).reshape(shape).astype(dtype)

