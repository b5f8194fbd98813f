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
The loops have no bounds tests and vectorise. The weight gradient is a
dot product per tap over the output gradient widened to Wp with zero
columns (so the dropped columns add nothing), summed elementwise over the
batch first: without fastmath LLVM does not vectorise a float reduction.

Terms are added in a fixed order (deterministic); the float32 sums differ
from the GEMM path's by rounding only. The GEMM path (ops.conv's columns)
is the reference, and stays for every other shape and under
``SPMDNET_KERNELS=xp``.
"""
import numpy as np

from ._cpu import CpuKernel
from ._numba import njit_inline
from ._target import check_target

def _forward(xflat, weight, bias, out, acc, geom):
    """out[n, o] = bias[o] + the taps of weight[o] over xflat[n] (wide, then cut)."""
    wp, dh, dw, groups = geom
    batch = xflat.shape[0]
    channels_out, cg, kh, kw = weight.shape
    ho, wo = out.shape[2], out.shape[3]
    og = channels_out // groups
    length = acc.shape[0]
    for n in range(batch):
        for o in range(channels_out):
            c0 = (o // og) * cg
            b = bias[o]
            for p in range(length):
                acc[p] = b
            for cc in range(cg):
                for i in range(kh):
                    row = xflat[n, c0 + cc, i * dh * wp:]
                    # five (5x5) or three taps of a kernel row per pass over the
                    # accumulator: one load and store of it per five or three
                    # multiply-adds
                    done = 0
                    if kw == 5:
                        _axpy5(acc, weight[o, cc, i], row, dw, length)
                        done = 5
                    for j in range(done, kw - 2, 3):
                        _axpy3(acc, weight[o, cc, i, j], weight[o, cc, i, j + 1],
                               weight[o, cc, i, j + 2], row[j * dw:], row[(j + 1) * dw:],
                               row[(j + 2) * dw:], length)
                    for j in range(kw - (kw - done) % 3, kw):
                        _axpy(acc, weight[o, cc, i, j], row[j * dw:], length)
            for r in range(ho):
                _copy_row(out[n, o, r], acc[r * wp:], wo)


def _weight_grad(xflat, gflat, gw, taps, geom):
    """gw[o, c, i, j] = sum over n of gflat[n, o] · xflat[n, c] at the tap's
    offset: each tap's products summed over the batch elementwise in
    ``taps`` (kh·kw, L; vectorised, no reduction in the hot loop), then each
    tap's row summed once."""
    wp, dh, dw, groups = geom
    batch, _, length = gflat.shape
    channels_out, cg, kh, kw = gw.shape
    og = channels_out // groups
    zero = gw.dtype.type(0)
    for o in range(channels_out):
        c0 = (o // og) * cg
        for cc in range(cg):
            for t in range(kh * kw):
                for p in range(length):
                    taps[t, p] = zero
            # four samples per pass over a tap's row: one load and store of it
            # per four multiply-adds
            full = batch - batch % 4
            for n in range(0, full, 4):
                for i in range(kh):
                    at = i * dh * wp
                    for j in range(kw):
                        start = at + j * dw
                        _mul_add4(taps[i * kw + j], gflat[n, o], xflat[n, c0 + cc, start:],
                                  gflat[n + 1, o], xflat[n + 1, c0 + cc, start:],
                                  gflat[n + 2, o], xflat[n + 2, c0 + cc, start:],
                                  gflat[n + 3, o], xflat[n + 3, c0 + cc, start:], length)
            for n in range(full, batch):
                g_row = gflat[n, o]
                for i in range(kh):
                    row = xflat[n, c0 + cc, i * dh * wp:]
                    for j in range(kw):
                        _mul_add(taps[i * kw + j], g_row, row[j * dw:], length)
            for i in range(kh):
                for j in range(kw):
                    total = zero
                    for p in range(length):
                        total += taps[i * kw + j, p]
                    gw[o, cc, i, j] = total


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
def _mul_add(dest, a, b, length):
    for p in range(length):
        dest[p] += a[p] * b[p]


@njit_inline
def _mul_add4(dest, a0, b0, a1, b1, a2, b2, a3, b3, length):
    for p in range(length):
        dest[p] += (a0[p] * b0[p] + a1[p] * b1[p]) + (a2[p] * b2[p] + a3[p] * b3[p])


@njit_inline
def _copy_row(dest, src, length):
    for k in range(length):
        dest[k] = src[k]


_forward_kernel = CpuKernel(_forward)
_weight_grad_kernel = CpuKernel(_weight_grad)


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
    acc = np.empty((ho - 1) * wp + wo, weight.dtype)
    _forward_kernel(xflat, weight, bias, out, acc, (int(wp), int(dilation[0]),
                                                    int(dilation[1]), int(groups)))
    return out


def widened(g, wp):
    """g (N, O, Ho, Wo) as (N, O, L) rows of Wp with zero columns past Wo
    (L = (Ho-1)·Wp + Wo): the layout of the wide accumulators."""
    n, o, ho, wo = g.shape
    wide = np.zeros((n, o, ho, wp), g.dtype)
    wide[..., :wo] = g
    return wide.reshape(n, o, ho * wp)[:, :, :(ho - 1) * wp + wo]


def weight_grad(xflat, wp, gflat, weight_shape, dilation, groups):
    """The weight gradient (O, C/G, kh, kw) from ``padded_flat``'s input and
    ``widened(g)``."""
    check_target("conv", xflat, gflat)
    gw = np.empty(weight_shape, gflat.dtype)
    taps = np.empty((weight_shape[2] * weight_shape[3], gflat.shape[2]), gflat.dtype)
    _weight_grad_kernel(xflat, np.ascontiguousarray(gflat), gw, taps,
                        (int(wp), int(dilation[0]), int(dilation[1]), int(groups)))
    return gw


def warmup(dtype):
    """Compile the CPU kernels for ``dtype``."""
    x = np.ones((1, 2, 3, 3), dtype)
    w = np.ones((2, 1, 2, 2), dtype)
    xflat, wp = padded_flat(x, (2, 2), ((0, 0), (0, 0)), (1, 1), (2, 2))
    out = forward(xflat, wp, w, None, (2, 2), (1, 1), 2)
    weight_grad(xflat, wp, widened(out, wp), w.shape, (1, 1), 2)
