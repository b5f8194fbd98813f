"""The two memory passes of ``ops.conv``'s columns path (NCHW, zero
padding, strides, dilation, groups), compiled for the CPU; the GEMMs stay
with BLAS.

The columns hold one row per output pixel, laid out (N, Ho, Wo, G, kh, kw,
C/G) as ``ops.conv_columns.columns`` builds them: a group's row is one
contiguous run, and the GEMMs read the output pixels as their long M side
(``ops.conv_columns`` has the measurements: with OpenBLAS's AVX-512 kernels
that orientation ran up to 1.9x faster on ResNet's 16-128 channel stride-2
layers than the pixels as the long N side).

- ``channels_last``: the input zero-padded and channels-last (N, Hp, Wp,
  C), from which the columns are a strided view whose rows copy in runs of
  kw·C/G values (one NumPy copy). Written a padded image row at a time,
  from the C rows of the NCHW planes under it (taken from
  ``dispatch.CHANNELS_LAST_MIN_WIDTH`` pixels wide).
- ``col2im``: the adjoint, the input gradient (N, C, H, W) from the columns'
  gradient (the transposed convolution's forward too). One image at a time:
  every window's row run adds into a zeroed padded channels-last image (a
  few KiB to 100 KiB, in L2) with no bounds test in the inner loop; its
  interior is then copied out to the C planes. The terms of each input
  element are added in the columns' (oh, ow, i, j) order (deterministic).

The plain-xp references are ``ops.conv_columns.channels_last_padded`` and
``ops.conv_columns.col2im_columns``.
"""
import numpy as np

from ..backend import xp_of
from ._cpu import CpuKernel
from ._numba import njit_inline
from ._target import check_target


def _channels_last(x, out, geom):
    """out[n, top + h, left + w, c] = x[n, c, h, w]; out's border is zero."""
    top, left = geom
    batch, channels, height, width = x.shape
    zero = out.dtype.type(0)
    for n in range(batch):
        flat = out[n].reshape(out.shape[1] * out.shape[2] * out.shape[3])
        for q in range(flat.shape[0]):
            flat[q] = zero
        for r in range(height):
            row = out[n, top + r].reshape(out.shape[2] * channels)
            for c in range(channels):
                _scatter_row(row[left * channels + c:], x[n, c, r], channels)


@njit_inline
def _scatter_row(dest, src, step):
    for k in range(src.shape[0]):
        dest[k * step] = src[k]


def _col2im(cols, gx, image, geom):
    """gx[n] = the interior of the padded channels-last image that collects
    the rows of cols[n]."""
    sh, sw, pt, pl, dh, dw = geom
    batch, ho, wo, groups, kh, kw, cg = cols.shape
    channels, height, width = gx.shape[1:]
    zero = image.dtype.type(0)
    flat = image.reshape(image.size)
    src = cols.reshape(cols.size)
    image_row = image.shape[1] * channels
    per_pixel = groups * kh * kw * cg
    # integer offsets into flat arrays, no per-run views: a run is 1-64 values
    # (16 channels, stride 2: 0.27 against 0.35 ms with a view per run); unsigned,
    # so Numba indexes them with no negative-index wraparound test
    run = np.uint64(cg)
    for n in range(batch):
        for q in range(flat.shape[0]):
            flat[q] = zero
        # the columns in their order, a tap's run at a time (a tap at a time along
        # the output row read them 64 bytes per 576 and ran 2.8x slower on 16
        # channels at stride 1; a window row's kw taps as one run overlap the next
        # window's and stalled on store forwarding)
        at = np.uint64(n * ho * wo * per_pixel)
        for oh in range(ho):
            for ow in range(wo):
                for g in range(groups):
                    for i in range(kh):
                        dest = np.uint64((oh * sh + i * dh) * image_row
                                         + ow * sw * channels + g * cg)
                        for j in range(kw):
                            _add_run(flat, dest + np.uint64(j * dw * channels), src, at, run)
                            at += run
        for r in range(height):  # the image row stays in L1 while its channels go out
            row = image[pt + r].reshape(image_row)
            for c in range(channels):
                _gather_row(gx[n, c, r], row[pl * channels + c:], channels)


@njit_inline
def _add_run(dest, d0, src, s0, length):
    for k in range(length):
        dest[d0 + k] += src[s0 + k]


@njit_inline
def _gather_row(dest, src, step):
    for k in range(dest.shape[0]):
        dest[k] = src[k * step]


_channels_last_kernel = CpuKernel(_channels_last)
_col2im_kernel = CpuKernel(_col2im)


def channels_last(x, pads):
    """x (N, C, H, W) as (N, H + top + bottom, W + left + right, C), zero
    outside x; ``pads`` ((top, bottom), (left, right)), each at least 0."""
    check_target("conv", x)
    (top, bottom), (left, right) = pads
    n, c, h, w = x.shape
    out = np.empty((n, h + top + bottom, w + left + right, c), x.dtype)
    _channels_last_kernel(np.ascontiguousarray(x), out, (int(top), int(left)))
    return out


def col2im(cols, in_hw, stride, pads, dilation):
    """(N, C, H, W) from columns (N, Ho, Wo, G, kh, kw, C/G): each input
    element the sum of the column entries its windows took from it. pads is
    ((top, bottom), (left, right)) (only top and left move the windows)."""
    check_target("conv", cols)
    if cols.ndim != 7:
        raise ValueError(f"conv kernels: expected columns (N, Ho, Wo, G, kh, kw, C/G), got "
                         f"{cols.shape}")
    xp = xp_of(cols)
    cols = xp.ascontiguousarray(cols)
    n, ho, wo, groups, kh, kw, cg = cols.shape
    (sh, sw), (dh, dw) = stride, dilation
    (top, _), (left, _) = pads
    h, w = in_hw
    # the image holds every window position and the input's interior
    image_h = max(top + h, (ho - 1) * sh + (kh - 1) * dh + 1)
    image_w = max(left + w, (wo - 1) * sw + (kw - 1) * dw + 1)
    gx = xp.empty((n, groups * cg, h, w), cols.dtype)
    image = np.empty((image_h, image_w, groups * cg), cols.dtype)
    geom = (int(sh), int(sw), int(top), int(left), int(dh), int(dw))
    _col2im_kernel(cols, gx, image, geom)
    return gx


def warmup(dtype):
    """Compile the CPU kernels for ``dtype``."""
    col2im(np.ones((1, 2, 2, 1, 2, 2, 1), dtype), (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1))
    channels_last(np.ones((1, 1, 2, 2), dtype), ((1, 1), (1, 1)))
