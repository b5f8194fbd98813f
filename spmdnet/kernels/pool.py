"""Max pooling with its argmax for ``ops.pooling.MaxPool2d``: values and
PyTorch's indices (flat h·W + w in each channel) in one pass, the first
maximum in the window's row-major order (the first NaN, when there is one);
padding is skipped, not read as -inf.

Each output row clips its window rows to the input once, each output
element its window columns, so the inner loops carry no bounds tests. The
common 2x2 stride-2 window without padding or dilation has its own
branch-free loop (three compare-selects per output, vectorised) on planes
without NaN. The CIFAR-10 net's pooling layers (batch 64, 1 thread): pool1
(6x28x28) 0.2-0.3 ms, pool2 (16x10x10) 0.12-0.19 ms, against 2.1-2.6 and
0.75-0.93 ms for a bounds test and a branch per window element (random
data mispredicts the branches), and 2.3 ms for pool1 on the plain-xp
reference (a -inf padded strided view, copied, then argmax).
"""
import numpy as np

from ..backend import xp_of
from ._cpu import CpuKernel
from ._numba import njit_inline
from ._target import check_target


@njit_inline
def _first(start, step, count):
    """The first tap t < count with start + t·step >= 0 (count if none)."""
    t = 0
    while t < count and start + t * step < 0:
        t += 1
    return t


@njit_inline
def _end(start, step, size, count):
    """One past the last tap t < count with start + t·step < size."""
    t = count
    while t > 0 and start + (t - 1) * step >= size:
        t -= 1
    return t


@njit_inline
def _takes(v, best):
    """v replaces the maximum so far: larger, or the first NaN."""
    return v > best or (v != v and best == best)


@njit_inline
def _has_nan(plane):
    """True when the plane holds a NaN (an integer count: it vectorises)."""
    flat = plane.ravel()
    nans = 0
    for p in range(flat.shape[0]):
        nans += flat[p] != flat[p]
    return nans > 0


@njit_inline
def _max_2x2(plane, out, idx, wi):
    """Windows 2x2 at stride 2, no padding or dilation, all inside a plane
    without NaN: a tournament of three compare-selects per output (first
    maximum: ties keep the earlier element). Branch-free, it vectorises; the
    NaN rule (two compares per step) made LLVM branch, 10x slower on random
    data, so NaN planes take ``_max_any``."""
    for oh in range(out.shape[0]):
        top, bottom = plane[2 * oh], plane[2 * oh + 1]
        values, at = out[oh], idx[oh]
        base = 2 * oh * wi
        for ow in range(out.shape[1]):
            w = 2 * ow
            a, b, c, d = top[w], top[w + 1], bottom[w], bottom[w + 1]
            right_top = b > a
            max_top = b if right_top else a
            right_bottom = d > c
            max_bottom = d if right_bottom else c
            lower = max_bottom > max_top
            values[ow] = max_bottom if lower else max_top
            at[ow] = base + w + ((wi + np.int64(right_bottom)) if lower
                                 else np.int64(right_top))


@njit_inline
def _max_any(plane, out, idx, geom):
    """Any window: each row's taps clipped to the plane once, each element's
    columns once. A window with no tap inside (padding and dilation allow
    it: a 1x1 plane, kernel 2, padding 1, dilation 2) gives -inf, as
    PyTorch's, and index -1 (its gradient goes nowhere)."""
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    hi, wi = plane.shape
    lowest = plane.dtype.type(-np.inf)
    for oh in range(out.shape[0]):
        h0 = oh * sh - ph
        i_lo, i_hi = _first(h0, dh, kh), _end(h0, dh, hi, kh)
        for ow in range(out.shape[1]):
            w0 = ow * sw - pw
            j_lo, j_hi = _first(w0, dw, kw), _end(w0, dw, wi, kw)
            best, at = lowest, -1
            for i in range(i_lo, i_hi):
                h = h0 + i * dh
                for j in range(j_lo, j_hi):
                    w = w0 + j * dw
                    v = plane[h, w]
                    if at < 0 or _takes(v, best):
                        best, at = v, h * wi + w
            out[oh, ow] = best
            idx[oh, ow] = at


def _max_pool(x, out, idx, geom):
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    simple = (kh == 2 and kw == 2 and sh == 2 and sw == 2 and ph == 0 and pw == 0
              and dh == 1 and dw == 1 and 2 * out.shape[2] <= x.shape[2]
              and 2 * out.shape[3] <= x.shape[3])
    for n in range(out.shape[0]):
        for c in range(out.shape[1]):
            if simple and not _has_nan(x[n, c]):
                _max_2x2(x[n, c], out[n, c], idx[n, c], x.shape[3])
            else:
                _max_any(x[n, c], out[n, c], idx[n, c], geom)


_max_pool_kernel = CpuKernel(_max_pool)


def max_pool_forward(x, kernel, stride, padding, dilation, out_hw):
    """(values, int64 indices), both (N, C, Ho, Wo), of max pooling x (N, C, H, W)."""
    check_target("max_pool2d", x)
    if x.ndim != 4 or min(x.shape[2:]) < 1:
        raise ValueError(f"max_pool2d kernels: expected a non-empty x (N, C, H, W), got "
                         f"{x.shape}")
    xp = xp_of(x)
    x = xp.ascontiguousarray(x)
    shape = x.shape[:2] + tuple(out_hw)
    out, idx = xp.empty(shape, x.dtype), xp.empty(shape, xp.int64)
    geom = tuple(int(v) for v in (*kernel, *stride, *padding, *dilation))
    _max_pool_kernel(x, out, idx, geom)
    return out, idx


def warmup(dtype):
    """Compile the CPU kernel for ``dtype``."""
    max_pool_forward(np.ones((1, 1, 2, 2), dtype), (2, 2), (2, 2), (0, 0), (1, 1), (1, 1))
