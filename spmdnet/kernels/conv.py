"""col2im for ``ops.conv`` (NCHW, zero padding, strides, dilation): the
input gradient (N, C, H, W) of a convolution from the gradient of its
columns, laid out (C, kh, kw, N, Ho, Wo) as ``ops.conv.columns`` builds
them (the layout that makes every convolution one GEMM over the whole
batch). The transposed convolution's forward (``ops.conv_transpose``) is
this same step. The GEMMs stay with BLAS.

One channel at a time, for a run of images (``PLANES_BYTES``): every
window adds into a zeroed padded plane per image (a few KiB each, in L2)
with no bounds test in the inner loop, which runs along the columns'
contiguous output row (vectorised at stride 1); the planes' interiors are
then copied out. The terms of each input element are added in
(i, j, oh, ow) order (deterministic).

The plain-xp reference is ``ops.conv.col2im_columns`` (kh·kw strided adds).
Measured on ResNet-18's 16-channel 3x3 layer (batch 32, 32x32, 1 thread,
CPU time): 1.3 ms against the reference's 7.3-8.5 ms (19 MB of columns).
"""
import numpy as np

from ..backend import xp_of
from ._cpu import CpuKernel
from ._numba import njit_inline
from ._target import check_target


# The padded planes of a run of images, one channel at a time, stay in L2
# within this many bytes. Reading the columns in their order (channel, tap,
# image) and not image by image (the 9 taps' rows of one image, 4-32 KiB
# apart, shared an L1 set) measured (b32, 1 thread, CPU time): ResNet-18's
# stride-2 3x3 layers 128 channels at 16x16 2.3 against 6.5 ms, 256 at 8x8
# 1.0 against 1.45, 64 at 32x32 4.4 against 4.8; its stride-1 16 channels
# at 32x32 1.3 against 2.6.
PLANES_BYTES = 1 << 18


def _col2im(cols, gx, planes, geom):
    """gx[n, c] = the interior of the padded plane that collects cols[c, :, :, n],
    a channel at a time for a run of images (one plane each)."""
    sh, sw, pt, pl, dh, dw = geom
    channels, kh, kw, batch, ho, wo = cols.shape
    h = gx.shape[2]
    zero = planes.dtype.type(0)
    flat = planes.reshape(planes.size)
    run = planes.shape[0]
    for c in range(channels):
        for n0 in range(0, batch, run):
            n1 = min(batch, n0 + run)
            for q in range(flat.shape[0]):
                flat[q] = zero
            for i in range(kh):
                for j in range(kw):
                    for n in range(n0, n1):
                        plane = planes[n - n0]
                        for oh in range(ho):
                            # 1-D rows with a start offset: the inner loop has no
                            # negative-index wraparound test and vectorises
                            _add_row(plane[oh * sh + i * dh, j * dw:], cols[c, i, j, n, oh],
                                     sw)
            for n in range(n0, n1):
                for r in range(h):
                    _copy_row(gx[n, c, r], planes[n - n0, r + pt, pl:])


@njit_inline
def _add_row(dest, src, step):
    if step == 1:
        for k in range(src.shape[0]):
            dest[k] += src[k]
    else:
        for k in range(src.shape[0]):
            dest[k * step] += src[k]


@njit_inline
def _copy_row(dest, src):
    for k in range(dest.shape[0]):
        dest[k] = src[k]


_col2im_kernel = CpuKernel(_col2im)


def col2im(cols, in_hw, stride, pads, dilation):
    """(N, C, H, W) from columns (C, kh, kw, N, Ho, Wo): each input element
    the sum of the column entries its windows took from it. pads is ((top,
    bottom), (left, right)) (only top and left move the windows)."""
    check_target("conv", cols)
    if cols.ndim != 6:
        raise ValueError(f"conv kernels: expected columns (C, kh, kw, N, Ho, Wo), got "
                         f"{cols.shape}")
    xp = xp_of(cols)
    cols = xp.ascontiguousarray(cols)
    c, kh, kw, n, ho, wo = cols.shape
    (sh, sw), (dh, dw) = stride, dilation
    (top, _), (left, _) = pads
    h, w = in_hw
    # the plane holds every window position and the input's interior
    plane_h = max(top + h, (ho - 1) * sh + (kh - 1) * dh + 1)
    plane_w = max(left + w, (wo - 1) * sw + (kw - 1) * dw + 1)
    gx = xp.empty((n, c, h, w), cols.dtype)
    run = max(1, min(n, PLANES_BYTES // (plane_h * plane_w * cols.itemsize)))
    planes = np.empty((run, plane_h, plane_w), cols.dtype)
    geom = (int(sh), int(sw), int(top), int(left), int(dh), int(dw))
    _col2im_kernel(cols, gx, planes, geom)
    return gx


def warmup(dtype):
    """Compile the CPU kernel for ``dtype``."""
    col2im(np.ones((1, 2, 2, 1, 2, 2), dtype), (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1))
