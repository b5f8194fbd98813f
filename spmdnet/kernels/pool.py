"""Max pooling with its argmax for ``ops.pooling.MaxPool2d``: values and
PyTorch's indices (flat h·W + w in each channel) in one pass, the first
maximum in the window's row-major order (the first NaN, when there is one);
padding is skipped, not read as -inf. One helper per output row. The
plain-xp reference (a -inf padded strided view, copied, then argmax) cost
2.3 ms a call of the CIFAR-10 net's first pooling layer (benchmarks/cnn_step.py, 1 thread).
"""
import numpy as np

from ..backend import xp_of
from ._cpu import CpuKernel
from ._numba import njit_inline
from ._target import check_target


@njit_inline
def _max_row(x, out, idx, n, c, oh, geom):
    """out[n, c, oh, :] and idx[n, c, oh, :]."""
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    hi, wi, wo = x.shape[2], x.shape[3], out.shape[3]
    for ow in range(wo):
        best = x[n, c, 0, 0]
        at = -1
        for i in range(kh):
            h = oh * sh - ph + i * dh
            if 0 <= h < hi:
                for j in range(kw):
                    w = ow * sw - pw + j * dw
                    if 0 <= w < wi:
                        v = x[n, c, h, w]
                        if at < 0 or v > best or (v != v and best == best):
                            best = v
                            at = h * wi + w
        out[n, c, oh, ow] = best
        idx[n, c, oh, ow] = at


def _max_pool(x, out, idx, geom):
    for n in range(out.shape[0]):
        for c in range(out.shape[1]):
            for oh in range(out.shape[2]):
                _max_row(x, out, idx, n, c, oh, geom)


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
