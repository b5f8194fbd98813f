"""The columns' GEMM path of ``ops.conv`` and ``ops.conv_transpose`` (NumPy
and CuPy alike): every convolution that neither Winograd nor the direct
kernels take is one GEMM over the whole batch per group.

The columns hold a row per output pixel, (N, Ho, Wo, G, kh, kw, C/G)
(``columns``): the input is padded channels-last once and each row copied
from a strided view in runs of kw·C/G values. Forward is ``columns (M, K)
@ weightᵀ (K, O)`` per group (M = N·Ho·Wo), moved to NCHW with the bias
added in the same pass. Backward: the output gradient once as (G, O/G, M)
(``by_channel``), the weight gradient one GEMM against the saved columns,
the input gradient ``g (M, O) @ weight (O, K)`` as columns scattered back
by ``kernels.lookup("conv2d", x, step="col2im")`` (kernels/conv.py) or by
``col2im_columns`` (the xp reference).

Why a row per output pixel: the pixels are then BLAS's long M side and the
weight the small operand. ResNet-18's stride-2 layers (width 16, b32,
OpenBLAS AVX-512, 1 thread) ran their GEMMs at 197-224 against 116-210
GFLOP/s forward, 152-222 against 98-186 for the weight gradient and
193-234 against 104-234 for the input gradient, than with the pixels as the
N side (columns (K, M)); whole layers (CPU time, min of 10, loaded machine)
16->32 channels at 32x32 forward 1.57 -> 1.08 ms, backward 2.54 -> 1.49;
32->64 0.88 -> 0.69 and 1.49 -> 1.01; 64->128 0.75 -> 0.58 and 1.05 ->
0.91.
"""
import math

from .. import kernels
from ..backend import xp_of
from ..kernels.dispatch import channels_last_takes


def channels_last_padded(x, pads):
    """x (N, C, H, W) as (N, H + top + bottom, W + left + right, C), zero
    outside x (the xp reference of kernels/conv.py's ``channels_last``)."""
    xp = xp_of(x)
    (top, bottom), (left, right) = pads
    n, c, h, w = x.shape
    out = xp.zeros((n, h + top + bottom, w + left + right, c), x.dtype)
    out[:, top:top + h, left:left + w] = x.transpose(0, 2, 3, 1)
    return out


def columns(x, kernel, stride, pads, dilation, out_hw, groups=1):
    """x (N, C, H, W) copied as the columns of its Ho x Wo windows, a row per
    output pixel: (N, Ho, Wo, G, kh, kw, C/G), cols[n, oh, ow, g, i, j, c] =
    x_padded[n, g·C/G + c, oh·sh + i·dh, ow·sw + j·dw]. ``pads`` ((top,
    bottom), (left, right)); the bottom and right grow to what the windows
    reach and the windows stop at ``out_hw`` (a transposed convolution's
    backward asks for its input's size). The input is padded channels-last
    once (kernels/conv.py's pass where ``dispatch.channels_last_takes``
    says so, else ``channels_last_padded``); each group's row is then copied
    from a strided view in runs of kw·C/G values."""
    xp = xp_of(x)
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    ho, wo = out_hw
    (top, _), (left, _) = pads
    bottom = max(0, (ho - 1) * sh + dh * (kh - 1) + 1 - h - top)
    right = max(0, (wo - 1) * sw + dw * (kw - 1) + 1 - w - left)
    kernel = kernels.lookup("conv2d", x, step="channels_last") \
        if channels_last_takes(x.shape) else None
    widen = kernel or channels_last_padded
    xh = widen(x, ((top, bottom), (left, right)))
    s = xh.strides
    cg = c // groups
    view = xp.lib.stride_tricks.as_strided(
        xh, (n, ho, wo, groups, kh, kw, cg),
        (s[0], s[1] * sh, s[2] * sw, s[3] * cg, s[1] * dh, s[2] * dw, s[3]))
    return xp.ascontiguousarray(view)


def col2im_columns(cols, in_hw, pads, stride, dilation):
    """The adjoint of ``columns`` (the xp reference of kernels/conv.py):
    cols (N, Ho, Wo, G, kh, kw, C/G) added into a zero padded channels-last
    input, returned without the padding as (N, C, H, W)."""
    xp = xp_of(cols)
    n, ho, wo, groups, kh, kw, cg = cols.shape
    (sh, sw), (dh, dw) = stride, dilation
    (top, _), (left, _) = pads
    h, w = in_hw
    out = xp.zeros((n, max(top + h, (ho - 1) * sh + (kh - 1) * dh + 1),
                    max(left + w, (wo - 1) * sw + (kw - 1) * dw + 1), groups, cg), cols.dtype)
    for i in range(kh):
        for j in range(kw):
            out[:, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                j * dw:j * dw + sw * (wo - 1) + 1:sw] += cols[:, :, :, :, i, j]
    out = out.reshape(out.shape[:3] + (groups * cg,))
    return xp.ascontiguousarray(out[:, top:top + h, left:left + w].transpose(0, 3, 1, 2))


def weight_rows(weight, groups):
    """The weight (O, C/G, kh, kw) as the GEMMs read it: (G, O/G, kh·kw·C/G),
    each row in the columns' (kh, kw, c) order."""
    o, cg, kh, kw = weight.shape
    return weight.reshape(groups, o // groups, cg, kh, kw).transpose(0, 1, 3, 4, 2) \
        .reshape(groups, o // groups, kh * kw * cg)


def group_rows(cols, groups):
    """The columns (N, Ho, Wo, G, ...) as (G, N·Ho·Wo, K/G): a view."""
    m = math.prod(cols.shape[:3])  # explicit sizes: n may be 0
    return cols.reshape(m, groups, math.prod(cols.shape[4:])).transpose(1, 0, 2)


def columns_product(cols, weight, groups, bias=None):
    """The convolution from its columns: (N, O, Ho, Wo) = weight (O, C/G,
    kh, kw) applied to cols (N, Ho, Wo, G, kh, kw, C/G), plus bias (O,).
    One GEMM per group, the M·K columns times the small (K, O/G) weight:
    with the output pixels as BLAS's M side it ran 1.3-1.9x faster than
    ``weight @ columnsᵀ`` on ResNet-18's stride-2 layers (OpenBLAS
    AVX-512, 1 thread)."""
    xp = xp_of(cols, weight)
    n, ho, wo = cols.shape[:3]
    o = weight.shape[0]
    # the (K, O/G) operand contiguous in the columns' (kh, kw, c) order: one copy
    _, cg, kh, kw = weight.shape
    w_t = xp.ascontiguousarray(weight.reshape(groups, o // groups, cg, kh, kw)
                               .transpose(0, 3, 4, 2, 1)).reshape(groups, kh * kw * cg,
                                                                  o // groups)
    prod = xp.matmul(group_rows(cols, groups), w_t)  # (G, M, O/G)
    prod = prod.reshape(groups, n, ho * wo, o // groups).transpose(1, 0, 3, 2)
    out = xp.empty((n, o, ho, wo), prod.dtype)
    dest = out.reshape(n, groups, o // groups, ho * wo)
    if bias is not None:  # added in the pass that moves the product to NCHW
        xp.add(prod, bias.reshape(1, groups, o // groups, 1), out=dest)
    else:
        dest[...] = prod
    return out


def by_channel(g, groups):
    """g (N, O, *) as (G, O/G, N·*) contiguous: the GEMM operand of the
    weight and input gradients."""
    xp = xp_of(g)
    n, o = g.shape[:2]
    rest = math.prod(g.shape[2:])  # explicit sizes: n may be 0
    g_t = xp.ascontiguousarray(g.reshape(n, o, rest).transpose(1, 0, 2))
    return g_t.reshape(groups, o // groups, n * rest)


def columns_grad(g_t, weight, in_shape, out_hw, stride, pads, dilation, col2im_kernel=None):
    """(N, C, H, W): ``g_tᵀ @ weight`` (the columns' gradient, a row per
    output pixel) scattered back to the input; g_t is ``by_channel(g)``.
    ``col2im_kernel``: kernels/conv.py's pass, else the xp reference."""
    xp = xp_of(g_t, weight)
    groups = g_t.shape[0]
    o, cg, kh, kw = weight.shape
    n, c, h, w = in_shape
    gcols = xp.matmul(g_t.transpose(0, 2, 1), weight_rows(weight, groups))  # (G, M, K/G)
    gcols = gcols.transpose(1, 0, 2).reshape((n,) + tuple(out_hw) + (groups, kh, kw, cg))
    if col2im_kernel is not None:
        return col2im_kernel(gcols, (h, w), stride, pads, dilation)
    return col2im_columns(gcols, (h, w), pads, stride, dilation)


def weight_grad(g_t, cols, weight_shape):
    """The weight gradient, one GEMM per group over the whole batch: g_t
    (G, O/G, M) against the columns (N, Ho, Wo, G, kh, kw, C/G) (M =
    N·Ho·Wo), returned as (O, C/G, kh, kw)."""
    xp = xp_of(g_t, cols)
    groups = g_t.shape[0]
    o, cg, kh, kw = weight_shape
    gw = xp.matmul(g_t, group_rows(cols, groups))  # (G, O/G, kh·kw·C/G)
    return xp.ascontiguousarray(gw.reshape(o, kh, kw, cg).transpose(0, 3, 1, 2))


__all__ = ["channels_last_padded", "columns", "col2im_columns", "weight_rows", "group_rows",
           "columns_product", "by_channel", "columns_grad", "weight_grad"]
