"""Direct stride-1 convolution for ``ops.conv`` on few input channels per
group: the forward, the input gradient (the same kernel over the padded
output gradient with the weights flipped and transposed) and, in
kernels/conv_direct_grad.py, the weight gradient, all without columns.

Im2col copies every input element kh·kw times; with 3 or 6 input channels
those columns (15 MB for the CIFAR Net's first layer at batch 64) cost more
than the GEMM that reads them, and a GEMM with 6 output rows runs far from
BLAS's peak. Here each (n, o) output plane is computed "wide": at stride 1
the output element (oh, ow) reads the padded input plane, flattened, at
``oh·Wp + ow + i·dh·Wp + j·dw``, so one tap (c, i, j) is one contiguous
axpy of length L = (Ho-1)·Wp + Wo over a flat accumulator (the columns
ow >= Wo of each row are computed and dropped: (Wp-Wo)/Wp wasted work).
The loops have no bounds tests and vectorise; four output channels of a
group share each pass over an input row (each load feeds four
multiply-adds; two for 5-wide kernels). The weight gradient is a dot product per
tap over the output gradient widened to Wp with zero columns (so the
dropped columns add nothing).

Rounding: the forward contracts a·x + y into fused multiply-adds
(fastmath "contract"): each output is one chain from its accumulator,
the taps in (c, i, j) order, whatever the number of channels per pass;
the weight gradient's dot products are reassociated
(kernels/conv_direct_grad.py). Both are deterministic (a fixed order for a
given build and shape), and their float32 results differ from the GEMM
path's by float32 rounding only; the tests compare with tolerances. The
GEMM path (ops.conv's columns) is the reference, and stays for every other
shape and under ``SPMDNET_KERNELS=xp``.

Why four output channels per pass: on the shapes dispatch routes here
that take it (3x3, at least 4 output channels per group) it beats two
(F.conv2d forward, 1 thread, CPU time, min of 15, three runs alternating
with a two-channel build, shared machine): the ResNet stem 3->16 3x3 pad 1
on 32x32, b32, 0.29-0.32 against 0.38 ms; 3->64 1.11-1.44 against
1.53-1.66 ms. 5x5 kernels (CIFAR conv1 3->6 on 32x32, b64: 0.38-0.46 ms
either way) and depthwise layers (one output channel per group: 32
channels at 16x16, b32, 0.21-0.25) never take it. Why pairs over a tap per
pass (forward, 1 thread): CIFAR conv1 (b64) 1.2 against 1.25-1.6 ms; conv2
(6->16 5x5 on 14x14) 1.2-1.4 against 1.9-2.0; the ResNet stem (b32)
0.8-0.9 against 1.1 ms.
"""
import numpy as np

from ._cpu import CpuKernel
from ._numba import njit_inline
from ._target import check_target
from .conv_direct_grad import _copy_row, weight_grad

__all__ = ["padded_flat", "forward", "input_grad", "weight_grad", "warmup"]


def _forward(xflat, weight, bias, out, acc, geom):
    """out[n, o] = bias[o] + the taps of weight[o] over xflat[n] (wide, then
    cut); four (or two) output channels of a group per pass over the input
    rows."""
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
            left = og - o % og  # output channels left in this group
            # 5 wide: the pair's 5-tap chain (four channels' 20 weights ran 1.5x slower)
            width = 4 if left >= 4 and kw != 5 else (2 if left >= 2 else 1)
            for k in range(width):
                b = bias[o + k]
                for p in range(length):
                    acc[k, p] = b
            if width == 4:  # its own loop nest: a branch per row cost 30% at 16x16
                _quad(acc[0], acc[1], acc[2], acc[3], weight[o:o + 4], xflat[n], c0,
                      (wp, dh, dw, length))
            else:
                for cc in range(cg):
                    for i in range(kh):
                        row = xflat[n, c0 + cc, i * dh * wp:]
                        if width == 2:
                            _taps_pair(acc[0], acc[1], weight[o, cc, i], weight[o + 1, cc, i],
                                       row, dw, length)
                        else:
                            _taps(acc[0], weight[o, cc, i], row, dw, length)
            for k in range(width):
                for r in range(ho):
                    _copy_row(out[n, o + k, r], acc[k, r * wp:], wo)
            o += width


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


@njit_inline
def _quad(acc0, acc1, acc2, acc3, w, x_n, c0, geom):
    """Four output channels' taps w (4, C/G, kh, kw) over the sample x_n from
    channel c0: ``_taps_pair``'s groups of taps (three, then one by one),
    each input load feeding four multiply-adds."""
    wp, dh, dw, length = geom
    cg, kh, kw = w.shape[1], w.shape[2], w.shape[3]
    for cc in range(cg):
        for i in range(kh):
            row = x_n[c0 + cc, i * dh * wp:]
            for j in range(0, kw - 2, 3):
                _axpy3_quad(acc0, acc1, acc2, acc3, w[:, cc, i, j:], row[j * dw:], dw, length)
            for j in range(kw - kw % 3, kw):
                _axpy1_quad(acc0, acc1, acc2, acc3, w[:, cc, i, j], row[j * dw:], length)


@njit_inline
def _axpy1_quad(acc0, acc1, acc2, acc3, w, src, length):
    a, b, c, d = w[0], w[1], w[2], w[3]
    for p in range(length):
        x = src[p]
        acc0[p] += a * x
        acc1[p] += b * x
        acc2[p] += c * x
        acc3[p] += d * x


@njit_inline
def _axpy3_quad(acc0, acc1, acc2, acc3, w, src, step, length):
    a0, a1, a2, b0, b1, b2 = w[0, 0], w[0, 1], w[0, 2], w[1, 0], w[1, 1], w[1, 2]
    c0, c1, c2, d0, d1, d2 = w[2, 0], w[2, 1], w[2, 2], w[3, 0], w[3, 1], w[3, 2]
    src0, src1, src2 = src[0:], src[step:], src[2 * step:]
    for p in range(length):
        x0, x1, x2 = src0[p], src1[p], src2[p]
        acc0[p] = acc0[p] + a0 * x0 + a1 * x1 + a2 * x2
        acc1[p] = acc1[p] + b0 * x0 + b1 * x1 + b2 * x2
        acc2[p] = acc2[p] + c0 * x0 + c1 * x1 + c2 * x2
        acc3[p] = acc3[p] + d0 * x0 + d1 * x1 + d2 * x2


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


_forward_kernel = CpuKernel(_forward, fastmath={"contract"})


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
    acc = np.empty((4, (ho - 1) * wp + wo), weight.dtype)
    _forward_kernel(xflat, weight, bias, out, acc, (int(wp), int(dilation[0]),
                                                    int(dilation[1]), int(groups)))
    return out


def input_grad(g, weight, in_hw, pads, dilation, groups):
    """The input gradient (N, C, H, W) of the stride-1 convolution whose
    output gradient is g (N, O, Ho, Wo): ``forward`` over g padded by
    d·(k-1) - pad before each axis (cropped where the padding was larger),
    with the weight flipped in both axes and its (O, C/G) transposed per
    group."""
    check_target("conv", g, weight)
    o, cg, kh, kw = weight.shape
    og = o // groups
    (top, _), (left, _) = pads
    dh, dw = dilation
    top, left = dh * (kh - 1) - top, dw * (kw - 1) - left
    g = g[:, :, max(-top, 0):, max(-left, 0):]
    flipped = weight[:, :, ::-1, ::-1].reshape(groups, og, cg, kh, kw).transpose(0, 2, 1, 3, 4)
    flipped = np.ascontiguousarray(flipped).reshape(groups * cg, og, kh, kw)
    gflat, wp = padded_flat(g, (kh, kw), ((max(top, 0), 0), (max(left, 0), 0)), dilation,
                            in_hw)
    return forward(gflat, wp, flipped, None, in_hw, dilation, groups)


def warmup(dtype):
    """Compile the CPU kernels for ``dtype``."""
    x = np.ones((1, 4, 3, 3), dtype)
    for w in (np.ones((4, 2, 2, 2), dtype), np.ones((8, 1, 2, 2), dtype)):
        xflat, wp = padded_flat(x, (2, 2), ((0, 0), (0, 0)), (1, 1), (2, 2))
        out = forward(xflat, wp, w, None, (2, 2), (1, 1), 4 // w.shape[1])
        weight_grad(xflat, wp, out, w.shape, (1, 1), 4 // w.shape[1])
        input_grad(out, w, (3, 3), ((0, 0), (0, 0)), (1, 1), 4 // w.shape[1])
