"""col2im for ``ops.conv.Conv2d`` (NCHW, zero padding, strides, dilation):
the input gradient (N, C, H, W) from the gradient of the columns (N, C, kh,
kw, Ho, Wo) that the op's forward copied out of the padded input's windows,
in one pass, each input row gathering its terms in a fixed order
(deterministic). The GEMMs stay with BLAS.

The plain-xp reference is ``ops.conv.col2im`` (kh·kw strided adds).
Measured on benchmarks/cnn_step.py's shapes (1 thread): 1.5 against 2.0 ms.
The forward's column copy has no kernel: one (2-4x slower than NumPy's copy
of the strided view) was measured and removed.
"""
import numpy as np

from ..backend import xp_of
from ._cpu import CpuKernel
from ._numba import njit_inline
from ._target import check_target


@njit_inline
def _valid(n_out, n_in, stride, offset):
    """The range [lo, hi) of output positions o with 0 <= o·stride + offset < n_in."""
    lo = (-offset + stride - 1) // stride if offset < 0 else 0
    hi = (n_in - 1 - offset) // stride + 1 if n_in - 1 - offset >= 0 else 0
    return min(lo, n_out), max(min(hi, n_out), min(lo, n_out))


@njit_inline
def _col2im_row(cols, gx, n, c, h, geom):
    """gx[n, c, h, :]: every column entry that the window view took from it,
    added in (i, j, ow) order."""
    sh, sw, ph, pw, dh, dw = geom
    wi = gx.shape[3]
    kh, kw, ho, wo = cols.shape[2], cols.shape[3], cols.shape[4], cols.shape[5]
    for w in range(wi):
        gx[n, c, h, w] = 0
    for i in range(kh):
        t = h + ph - i * dh
        if t < 0 or t % sh != 0 or t // sh >= ho:
            continue
        oh = t // sh
        for j in range(kw):
            off = j * dw - pw
            lo, up = _valid(wo, wi, sw, off)
            for ow in range(lo, up):
                gx[n, c, h, ow * sw + off] += cols[n, c, i, j, oh, ow]


def _col2im(cols, gx, geom):
    for n in range(gx.shape[0]):
        for c in range(gx.shape[1]):
            for h in range(gx.shape[2]):
                _col2im_row(cols, gx, n, c, h, geom)


_col2im_kernel = CpuKernel(_col2im)


def col2im(cols, in_hw, stride, pads, dilation):
    """(N, C, H, W) from columns (N, C, kh, kw, Ho, Wo): each input element
    the sum of the column entries its windows took from it. pads is ((top,
    bottom), (left, right)) (only top and left move the windows)."""
    check_target("conv", cols)
    if cols.ndim != 6:
        raise ValueError(f"conv kernels: expected columns (N, C, kh, kw, Ho, Wo), got "
                         f"{cols.shape}")
    xp = xp_of(cols)
    cols = xp.ascontiguousarray(cols)
    gx = xp.empty(cols.shape[:2] + tuple(in_hw), cols.dtype)
    geom = (int(stride[0]), int(stride[1]), int(pads[0][0]), int(pads[1][0]),
            int(dilation[0]), int(dilation[1]))
    _col2im_kernel(cols, gx, geom)
    return gx


def warmup(dtype):
    """Compile the CPU kernel for ``dtype``."""
    col2im(np.ones((1, 1, 2, 2, 2, 2), dtype), (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1))
