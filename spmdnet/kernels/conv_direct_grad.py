"""The direct convolution's weight gradient (kernels/conv_direct.py has
the forward and the input gradient, and its docstring the layout): a dot
product per tap between the output gradient, widened to the padded input's
row width Wp with zero columns, and the flat padded input shifted by the
tap, over L = (Ho-1)·Wp + Wo elements; a kernel row's taps for two output
channels of a group per pass over an input row.

Rounding: the dot products are reassociated (fastmath "reassoc": LLVM
splits each sum into vector lanes, 10x an in-order float sum, which it
cannot vectorise), in a fixed order for a given build and shape; the
float32 results differ from the GEMM path's by rounding only.
"""
import numpy as np

from ._cpu import CpuKernel
from ._numba import njit_inline
from ._target import check_target


def _weight_grad(xflat, g, gw, wide, geom):
    """gw[o, c, i, j] = sum over n and p of wide_g[n, o, p] · xflat[n, c, p +
    i·dh·Wp + j·dw], where wide_g is g's (Ho, Wo) plane as rows of Wp with
    zero columns past Wo (built per sample in ``wide``, in L1): a dot
    product per tap, a kernel row's taps for two output channels of a group
    in one pass over the input row (each load feeds several multiply-adds).
    Compiled with reassociation: the sums vectorise in lanes.

    Those zero columns meet input columns no window of theirs reads: an inf
    or NaN there would add 0·inf = NaN to taps the GEMM path leaves finite.
    An input with any non-finite element takes dot products row by row
    (Wo long: slower, only the windows' own terms) instead."""
    wp, dh, dw, groups, length = geom
    batch, _, ho, wo = g.shape
    channels_out, cg, kh, kw = gw.shape
    og = channels_out // groups
    zero = gw.dtype.type(0)
    by_row = _has_nonfinite(xflat)
    for o in range(channels_out):
        for cc in range(cg):
            for i in range(kh):
                for j in range(kw):
                    gw[o, cc, i, j] = zero
    for k in range(2):
        for p in range(wide.shape[1]):
            wide[k, p] = zero  # the columns past Wo stay zero
    o = 0
    while o < channels_out:
        c0 = (o // og) * cg
        pair = o + 1 < channels_out and (o + 1) // og == o // og
        for n in range(batch):
            if by_row:
                _weight_grad_rows(xflat[n], g[n], gw, o, c0, pair, geom)
                continue
            for k in range(2 if pair else 1):
                for r in range(ho):
                    _copy_row(wide[k, r * wp:], g[n, o + k, r], wo)
            for cc in range(cg):
                for i in range(kh):
                    row = xflat[n, c0 + cc, i * dh * wp:]
                    if pair:
                        _dots_pair(gw[o, cc, i], gw[o + 1, cc, i], wide[0], wide[1], row, dw,
                                   length)
                    else:
                        _dots(gw[o, cc, i], wide[0], row, dw, length)
        o += 2 if pair else 1


@njit_inline
def _has_nonfinite(xflat):
    """True when xflat holds an inf or NaN (an integer count: it vectorises)."""
    flat = xflat.ravel()
    inf = flat.dtype.type(np.inf)
    bad = 0
    for p in range(flat.shape[0]):
        bad += not (abs(flat[p]) < inf)
    return bad > 0


@njit_inline
def _weight_grad_rows(x_n, g_n, gw, o, c0, pair, geom):
    """One sample's terms of output channel o (and o + 1 with pair) added
    into gw, one output row at a time: only the windows' own columns."""
    wp, dh, dw, _, _ = geom
    ho, wo = g_n.shape[1], g_n.shape[2]
    cg, kh = gw.shape[1], gw.shape[2]
    for cc in range(cg):
        for i in range(kh):
            for r in range(ho):
                row = x_n[c0 + cc, (r + i * dh) * wp:]
                if pair:
                    _dots_pair(gw[o, cc, i], gw[o + 1, cc, i], g_n[o, r], g_n[o + 1, r], row,
                               dw, wo)
                else:
                    _dots(gw[o, cc, i], g_n[o, r], row, dw, wo)


@njit_inline
def _dots(dest, g, row, dw, length):
    """dest[j] += the dot product of g with row shifted by j·dw, every j,
    three taps per pass."""
    kw = dest.shape[0]
    for j in range(0, kw - 2, 3):
        s0, s1, s2 = _dot3(g, row[j * dw:], dw, length)
        dest[j] += s0
        dest[j + 1] += s1
        dest[j + 2] += s2
    for j in range(kw - kw % 3, kw):
        dest[j] += _dot(g, row[j * dw:], length)


@njit_inline
def _dots_pair(dest0, dest1, g0, g1, row, dw, length):
    """``_dots`` for two output channels' rows g0, g1 over one input row."""
    kw = dest0.shape[0]
    done = 0
    if kw == 5:
        s = _dot5_pair(g0, g1, row, dw, length)
        for k in range(5):
            dest0[k] += s[k]
            dest1[k] += s[5 + k]
        done = 5
    for j in range(done, kw - 2, 3):
        s = _dot3_pair(g0, g1, row[j * dw:], dw, length)
        for k in range(3):
            dest0[j + k] += s[k]
            dest1[j + k] += s[3 + k]
    for j in range(kw - (kw - done) % 3, kw):
        dest0[j] += _dot(g0, row[j * dw:], length)
        dest1[j] += _dot(g1, row[j * dw:], length)


@njit_inline
def _dot(a, b, length):
    total = a.dtype.type(0)
    for p in range(length):
        total += a[p] * b[p]
    return total


@njit_inline
def _dot3(g, src, step, length):
    src0, src1, src2 = src[0:], src[step:], src[2 * step:]
    s0 = s1 = s2 = g.dtype.type(0)
    for p in range(length):
        v = g[p]
        s0 += v * src0[p]
        s1 += v * src1[p]
        s2 += v * src2[p]
    return s0, s1, s2


@njit_inline
def _dot3_pair(g0, g1, src, step, length):
    src0, src1, src2 = src[0:], src[step:], src[2 * step:]
    s0 = s1 = s2 = t0 = t1 = t2 = g0.dtype.type(0)
    for p in range(length):
        x0, x1, x2 = src0[p], src1[p], src2[p]
        u, v = g0[p], g1[p]
        s0 += u * x0
        s1 += u * x1
        s2 += u * x2
        t0 += v * x0
        t1 += v * x1
        t2 += v * x2
    return s0, s1, s2, t0, t1, t2


@njit_inline
def _dot5_pair(g0, g1, src, step, length):
    src0, src1, src2 = src[0:], src[step:], src[2 * step:]
    src3, src4 = src[3 * step:], src[4 * step:]
    s0 = s1 = s2 = s3 = s4 = t0 = t1 = t2 = t3 = t4 = g0.dtype.type(0)
    for p in range(length):
        x0, x1, x2, x3, x4 = src0[p], src1[p], src2[p], src3[p], src4[p]
        u, v = g0[p], g1[p]
        s0 += u * x0
        s1 += u * x1
        s2 += u * x2
        s3 += u * x3
        s4 += u * x4
        t0 += v * x0
        t1 += v * x1
        t2 += v * x2
        t3 += v * x3
        t4 += v * x4
    return s0, s1, s2, s3, s4, t0, t1, t2, t3, t4


@njit_inline
def _copy_row(dest, src, length):
    for k in range(length):
        dest[k] = src[k]


# reassociated dot products: the module docstring
_weight_grad_kernel = CpuKernel(_weight_grad, fastmath={"reassoc", "contract"})


def weight_grad(xflat, wp, g, weight_shape, dilation, groups):
    """The weight gradient (O, C/G, kh, kw) from ``padded_flat``'s input and
    the output gradient g (N, O, Ho, Wo) (widened to Wp inside the kernel, a
    sample at a time in an L1 buffer): stride 1, so each
    tap's dot product runs over L = (Ho-1)·Wp + Wo elements."""
    check_target("conv", xflat, g)
    g = np.ascontiguousarray(g)
    ho, wo = g.shape[2], g.shape[3]
    gw = np.empty(weight_shape, g.dtype)
    wide = np.empty((2, ho * wp), g.dtype)
    _weight_grad_kernel(xflat, g, gw, wide, (int(wp), int(dilation[0]), int(dilation[1]),
                                             int(groups), int((ho - 1) * wp + wo)))
    return gw

