"""Direct stride-1 convolution for ``ops.conv`` on few input channels per
group: the forward and the weight gradient without columns (the input
gradient, which needs no saved columns, stays ``ops.conv.columns_grad``).

Im2col copies every input element kh·kw times; with 3 or 6 input channels
those columns (15 MB for the CIFAR Net's first layer at batch 64) cost more
than the GEMM that reads them, and a GEMM with 6 output rows runs far from
BLAS's peak. Here each (n, o) output plane is computed "wide": at stride 1
the output element (oh, ow) reads the padded input plane, flattened, at
``oh·Wp + ow + i·dh·Wp + j·dw``, so one tap (c, i, j) is one contiguous
axpy of length L = (Ho-1)·Wp + Wo over a flat accumulator (the columns
ow >= Wo of each row are computed and dropped: (Wp-Wo)/Wp wasted work).
The loops have no bounds tests and vectorise; two output channels of a
group share each pass over an input row (each load feeds two multiply-adds).
The weight gradient is a dot product per tap over the output gradient
widened to Wp with zero columns (so the dropped columns add nothing; one
sample's rows at a time, in an L1 buffer), a kernel row's taps for two
output channels per pass.

Rounding: the forward contracts a·x + y into fused multiply-adds
(fastmath "contract"), and the weight gradient's dot products are
reassociated (fastmath "reassoc": LLVM splits each sum into vector lanes,
10x an in-order float sum, which it cannot vectorise). Both are
deterministic (a fixed order for a given build and shape), and their
float32 results differ from the GEMM path's by float32 rounding only; the
tests compare with tolerances. The GEMM path (ops.conv's columns) is the
reference, and stays for every other shape and under
``SPMDNET_KERNELS=xp``.

Measured against the version before (a tap per pass, the weight
gradient's products summed elementwise over the batch, then per tap), 1
thread, kernel calls alone: CIFAR conv1 (3->6 5x5, b64) forward 1.25-1.6 ->
1.2 ms, weight gradient 4.2 -> 1.1 ms; conv2 (6->16 5x5 on 14x14) 1.9-2.0
-> 1.2-1.4 and 2.8 -> 1.0-1.1 ms; the ResNet stem (3->16 3x3 pad 1, b32)
1.1 -> 0.8-0.9 and 3.0-3.1 -> 0.74 ms; depthwise 3x3 (32 channels, 16x16,
b32) 0.38 -> 0.38 and 0.7 -> 0.42 ms.
"""
import numpy as np

from ._cpu import CpuKernel
from ._numba import njit_inline
from ._target import check_target


def _forward(xflat, weight, bias, out, acc, geom):
    """out[n, o] = bias[o] + the taps of weight[o] over xflat[n] (wide, then
    cut); two output channels of a group per pass over the input rows."""
    wp, dh, dw, groups = geom
    batch = xflat.shape[0]
    channels_out, cg, kh, kw = weight.shape
    ho, wo = out.shape[2], out.shape[3]
    og = channels_out // groups
    length = acc.shape[1]
    for n in range(batch):
        o = 0
        while o < channels_out:
            c0 = (o // og) * cg
            pair = o + 1 < channels_out and (o + 1) // og == o // og
            for k in range(2 if pair else 1):
                b = bias[o + k]
                for p in range(length):
                    acc[k, p] = b
            for cc in range(cg):
                for i in range(kh):
                    row = xflat[n, c0 + cc, i * dh * wp:]
                    if pair:
                        _taps_pair(acc[0], acc[1], weight[o, cc, i], weight[o + 1, cc, i],
                                   row, dw, length)
                    else:
                        _taps(acc[0], weight[o, cc, i], row, dw, length)
            for k in range(2 if pair else 1):
                for r in range(ho):
                    _copy_row(out[n, o + k, r], acc[k, r * wp:], wo)
            o += 2 if pair else 1


@njit_inline
def _taps(acc, w_row, row, dw, length):
    """acc += one kernel row's taps over the input row: five (5x5) or three
    taps per pass over the accumulator (one load and store of it per five or
    three multiply-adds)."""
    kw = w_row.shape[0]
    done = 0
    if kw == 5:
        _axpy5(acc, w_row, row, dw, length)
        done = 5
    for j in range(done, kw - 2, 3):
        _axpy3(acc, w_row[j], w_row[j + 1], w_row[j + 2], row[j * dw:], row[(j + 1) * dw:],
               row[(j + 2) * dw:], length)
    for j in range(kw - (kw - done) % 3, kw):
        _axpy(acc, w_row[j], row[j * dw:], length)


@njit_inline
def _taps_pair(acc0, acc1, w0, w1, row, dw, length):
    """``_taps`` for two output channels at once: each input load feeds two
    multiply-adds (AVX2's 16 registers hold the ten weights of 5 taps)."""
    kw = w0.shape[0]
    done = 0
    if kw == 5:
        _axpy5_pair(acc0, acc1, w0, w1, row, dw, length)
        done = 5
    for j in range(done, kw - 2, 3):
        _axpy3_pair(acc0, acc1, w0[j:], w1[j:], row[j * dw:], dw, length)
    for j in range(kw - (kw - done) % 3, kw):
        _axpy(acc0, w0[j], row[j * dw:], length)
        _axpy(acc1, w1[j], row[j * dw:], length)


@njit_inline
def _axpy5_pair(acc0, acc1, w0, w1, src, step, length):
    a0, a1, a2, a3, a4 = w0[0], w0[1], w0[2], w0[3], w0[4]
    b0, b1, b2, b3, b4 = w1[0], w1[1], w1[2], w1[3], w1[4]
    src0, src1, src2 = src[0:], src[step:], src[2 * step:]
    src3, src4 = src[3 * step:], src[4 * step:]
    for p in range(length):
        x0, x1, x2, x3, x4 = src0[p], src1[p], src2[p], src3[p], src4[p]
        # a chain from the accumulator: five fused multiply-adds each (2-8%
        # faster than the tree of products, whose muls and adds took the same
        # FMA ports)
        acc0[p] = acc0[p] + a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3 + a4 * x4
        acc1[p] = acc1[p] + b0 * x0 + b1 * x1 + b2 * x2 + b3 * x3 + b4 * x4


@njit_inline
def _axpy3_pair(acc0, acc1, w0, w1, src, step, length):
    a0, a1, a2, b0, b1, b2 = w0[0], w0[1], w0[2], w1[0], w1[1], w1[2]
    src0, src1, src2 = src[0:], src[step:], src[2 * step:]
    for p in range(length):
        x0, x1, x2 = src0[p], src1[p], src2[p]
        acc0[p] = acc0[p] + a0 * x0 + a1 * x1 + a2 * x2
        acc1[p] = acc1[p] + b0 * x0 + b1 * x1 + b2 * x2


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
def _axpy(dest, a, src, length):
    for p in range(length):
        dest[p] += a * src[p]


@njit_inline
def _axpy3(dest, a0, a1, a2, src0, src1, src2, length):
    # three 1-D sources indexed by p alone: no wraparound test, vectorised
    for p in range(length):
        dest[p] += a0 * src0[p] + a1 * src1[p] + a2 * src2[p]


@njit_inline
def _axpy5(dest, taps, src, step, length):
    a0, a1, a2, a3, a4 = taps[0], taps[1], taps[2], taps[3], taps[4]
    src0, src1, src2 = src[0:], src[step:], src[2 * step:]
    src3, src4 = src[3 * step:], src[4 * step:]
    for p in range(length):
        dest[p] += ((a0 * src0[p] + a1 * src1[p]) + (a2 * src2[p] + a3 * src3[p])) + a4 * src4[p]


@njit_inline
def _copy_row(dest, src, length):
    for k in range(length):
        dest[k] = src[k]


_forward_kernel = CpuKernel(_forward, fastmath={"contract"})
# the module docstring: contracted multiply-adds, reassociated dot products
_weight_grad_kernel = CpuKernel(_weight_grad, fastmath={"reassoc", "contract"})


def padded_flat(x, kernel, pads, dilation, out_hw):
    """x (N, C, H, W) zero padded so that every stride-1 window of the
    (Ho, Wo) output fits, as (N, C, Hp·Wp), and Wp."""
    n, c, h, w = x.shape
    (kh, kw), (dh, dw) = kernel, dilation
    ho, wo = out_hw
    (top, _), (left, _) = pads
    hp = max(top + h, ho + dh * (kh - 1))
    wp = max(left + w, wo + dw * (kw - 1))
    padded = np.zeros((n, c, hp, wp), x.dtype)
    padded[:, :, top:top + h, left:left + w] = x
    return padded.reshape(n, c, hp * wp), wp


def forward(xflat, wp, weight, bias, out_hw, dilation, groups):
    """The convolution (N, O, Ho, Wo) at stride 1 from ``padded_flat``'s input."""
    check_target("conv", xflat, weight, bias)
    n = xflat.shape[0]
    o = weight.shape[0]
    ho, wo = out_hw
    weight = np.ascontiguousarray(weight)
    bias = np.zeros(o, weight.dtype) if bias is None else np.ascontiguousarray(bias)
    out = np.empty((n, o, ho, wo), weight.dtype)
    acc = np.empty((2, (ho - 1) * wp + wo), weight.dtype)
    _forward_kernel(xflat, weight, bias, out, acc, (int(wp), int(dilation[0]),
                                                    int(dilation[1]), int(groups)))
    return out


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


def warmup(dtype):
    """Compile the CPU kernels for ``dtype``."""
    x = np.ones((1, 2, 3, 3), dtype)
    w = np.ones((2, 1, 2, 2), dtype)
    xflat, wp = padded_flat(x, (2, 2), ((0, 0), (0, 0)), (1, 1), (2, 2))
    out = forward(xflat, wp, w, None, (2, 2), (1, 1), 2)
    weight_grad(xflat, wp, out, w.shape, (1, 1), 2)
