"""im2col and col2im for ``ops.conv.Conv2d`` (NCHW, zero padding, strides,
dilation), one pass each; the GEMMs stay with BLAS (cuBLAS).

``im2col`` writes the columns (N, C, kh, kw, Ho, Wo) of a convolution's
windows, zeros where a window covers the padding; ``col2im`` is its
adjoint, the input gradient (N, C, H, W) from the columns' gradient, each
input row gathering its terms in a fixed order (deterministic, no atomics).
Both work row by row: one helper per row, looped on the CPU, one CUDA thread
per row. The plain-xp reference: ``ops.conv.padded_windows`` (a strided view
copied by NumPy) and ``ops.conv.col2im`` (kh·kw strided adds). Measured on
benchmarks/cnn_step.py's shapes (1 thread): col2im 1.5 against 2.0 ms, so
dispatch.TABLE takes it; im2col 2-4x slower than NumPy's copy, so it has no
row (kept, tested, for a later CUDA measurement).
"""
import numpy as np

from ..backend import xp_of
from ._cpu import CpuKernel
from ._cuda import Builder, launch
from ._numba import njit_inline
from ._target import check_target


@njit_inline
def _valid(n_out, n_in, stride, offset):
    """The range [lo, hi) of output positions o with 0 <= o·stride + offset < n_in."""
    lo = (-offset + stride - 1) // stride if offset < 0 else 0
    hi = (n_in - 1 - offset) // stride + 1 if n_in - 1 - offset >= 0 else 0
    return min(lo, n_out), max(min(hi, n_out), min(lo, n_out))


@njit_inline
def _im2col_row(x, cols, n, c, i, j, oh, geom):
    """cols[n, c, i, j, oh, :]."""
    sh, sw, ph, pw, dh, dw = geom
    hi, wi, wo = x.shape[2], x.shape[3], cols.shape[5]
    h = oh * sh - ph + i * dh
    off = j * dw - pw
    lo, up = _valid(wo, wi, sw, off) if 0 <= h < hi else (wo, wo)
    for ow in range(lo):
        cols[n, c, i, j, oh, ow] = 0
    for ow in range(lo, up):
        cols[n, c, i, j, oh, ow] = x[n, c, h, ow * sw + off]
    for ow in range(up, wo):
        cols[n, c, i, j, oh, ow] = 0


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


def _im2col(x, cols, geom):
    for n in range(cols.shape[0]):
        for c in range(cols.shape[1]):
            for i in range(cols.shape[2]):
                for j in range(cols.shape[3]):
                    for oh in range(cols.shape[4]):
                        _im2col_row(x, cols, n, c, i, j, oh, geom)


def _col2im(cols, gx, geom):
    for n in range(gx.shape[0]):
        for c in range(gx.shape[1]):
            for h in range(gx.shape[2]):
                _col2im_row(cols, gx, n, c, h, geom)


_cpu = {"im2col": CpuKernel(_im2col), "col2im": CpuKernel(_col2im)}

cuda = None  # numba.cuda, bound by _cuda.Builder (the CUDA simulator swaps this global)


@Builder
def _cuda_kernels():
    def im2col(x, cols, geom):  # one thread per row (n, c, i, j, oh)
        r = cuda.grid(1)
        if r < cols.shape[0] * cols.shape[1] * cols.shape[2] * cols.shape[3] * cols.shape[4]:
            oh, t = r % cols.shape[4], r // cols.shape[4]
            j, t = t % cols.shape[3], t // cols.shape[3]
            i, t = t % cols.shape[2], t // cols.shape[2]
            _im2col_row(x, cols, t // cols.shape[1], t % cols.shape[1], i, j, oh, geom)

    def col2im(cols, gx, geom):  # one thread per row (n, c, h)
        r = cuda.grid(1)
        if r < gx.shape[0] * gx.shape[1] * gx.shape[2]:
            h, t = r % gx.shape[2], r // gx.shape[2]
            _col2im_row(cols, gx, t // gx.shape[1], t % gx.shape[1], h, geom)

    return {"im2col": im2col, "col2im": col2im}


def _run(name, src, dst_shape, stride, pads, dilation):
    """``name``'s kernel from src into a new array of dst_shape; one CUDA
    thread per row (last axis) of the new array."""
    where = check_target("conv", src)
    xp = xp_of(src)
    src = xp.ascontiguousarray(src)
    dst = xp.empty(dst_shape, src.dtype)
    geom = (int(stride[0]), int(stride[1]), int(pads[0][0]), int(pads[1][0]),
            int(dilation[0]), int(dilation[1]))
    if where == "cpu":
        _cpu[name](src, dst, geom)
    else:
        launch(_cuda_kernels()[name], dst.size // max(dst.shape[-1], 1), src, dst, geom,
               stream_of=src)
    return dst


def im2col(x, kernel, stride, pads, dilation, out_hw):
    """The columns (N, C, kh, kw, Ho, Wo) of x (N, C, H, W): pads is ((top,
    bottom), (left, right)) (only top and left move the windows)."""
    if x.ndim != 4:
        raise ValueError(f"conv kernels: expected x (N, C, H, W), got {x.shape}")
    shape = x.shape[:2] + tuple(kernel) + tuple(out_hw)
    return _run("im2col", x, shape, stride, pads, dilation)


def col2im(cols, in_hw, stride, pads, dilation):
    """The adjoint of ``im2col``: (N, C, H, W) from columns (N, C, kh, kw, Ho, Wo)."""
    if cols.ndim != 6:
        raise ValueError(f"conv kernels: expected columns (N, C, kh, kw, Ho, Wo), got "
                         f"{cols.shape}")
    return _run("col2im", cols, cols.shape[:2] + tuple(in_hw), stride, pads, dilation)


def warmup(dtype):
    """Compile both CPU kernels for ``dtype``."""
    cols = im2col(np.ones((1, 1, 3, 3), dtype), (2, 2), (1, 1), ((0, 0), (0, 0)), (1, 1),
                  (2, 2))
    col2im(cols, (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1))
