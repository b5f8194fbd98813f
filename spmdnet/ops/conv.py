"""Convolutions, NCHW, PyTorch's semantics: ``conv2d`` and ``conv1d`` (a
conv2d over a height of one); the shared steps of ``ops.conv_transpose``.

Every convolution that the kernels below do not take is one GEMM over the
whole batch per group on a row of columns per output pixel
(``ops.conv_columns``, with kernels/conv.py's channels-last and col2im
passes on the CPU).

Stride-1 3x3 convolutions on many channels (ResNet's; where
``kernels.dispatch.winograd_takes`` says so) run Winograd F(2x2, 3x3)
(kernels/winograd.py): 2.25x fewer multiply-adds in 16 GEMMs over blocks
of images kept in L2, the input and the transformed weight saved (the
input's transform is computed again in backward), no columns, no col2im;
an input or output gradient holding an inf, a NaN or a value too large for
Winograd's sums (found by its own transforms) takes the columns' GEMM,
whose sums give PyTorch's inf.

1x1 convolutions without padding, one group (``conv_pointwise``): a GEMM
per image on the strided-sampled input, already NCHW (no columns).

Stride-1 convolutions with few input channels per group (where
``kernels.dispatch.conv_direct_takes`` says so: depthwise, single-channel,
up to 15 channels with 9 taps or more: the CIFAR Net's layers, ResNets
narrower than 16 channels) build no columns: kernels/conv_direct.py's
forward and weight gradient read the padded input directly (saved instead
of the columns); the input gradient is the same forward kernel over the
padded output gradient with the flipped weights where
``conv_direct_input_takes`` says so, else the columns' GEMM and col2im.
"""

from .. import kernels
from ..autograd import Function
from ..kernels import conv_direct
from ..kernels.dispatch import conv_direct_input_takes, conv_direct_takes, winograd_takes
from ..backend import xp_of
from .arith import as_tensor_like
from . import conv_pointwise as pointwise
from .conv_columns import by_channel, columns, columns_grad, columns_product, weight_grad
from .conv_pointwise import pointwise_takes


def _pair(value, name):
    """An int or a pair of ints as a pair (PyTorch's _pair)."""
    if isinstance(value, int):
        return value, value
    value = tuple(int(v) for v in value)
    if len(value) == 1:
        return value * 2
    if len(value) != 2:
        raise RuntimeError(f"conv: expected {name} to be a single integer or a pair, got "
                           f"{value}")
    return value


def out_size(size, pad, kernel, stride, dilation):
    """PyTorch's output size: floor((size + pads - d·(k-1) - 1) / s) + 1."""
    return (size + pad[0] + pad[1] - dilation * (kernel - 1) - 1) // stride + 1


def padded_windows(x, pads, kernel, stride, dilation, fill=0.0):
    """The padded input (N, C, Hp, Wp) and its window view (N, C, kh, kw, Ho,
    Wo) by strides (no copy beyond the padding). ``pads`` is ((top,
    bottom), (left, right)); the bottom and right are extended with ``fill``
    where the last window (ceil_mode) reaches past them."""
    xp = xp_of(x)
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    ho, wo = out_size(h, pads[0], kh, sh, dh), out_size(w, pads[1], kw, sw, dw)
    need_h, need_w = (ho - 1) * sh + dh * (kh - 1) + 1, (wo - 1) * sw + dw * (kw - 1) + 1
    bottom = max(pads[0][1], need_h - h - pads[0][0])
    right = max(pads[1][1], need_w - w - pads[1][0])
    if pads[0][0] or pads[1][0] or bottom or right:
        x = xp.pad(x, ((0, 0), (0, 0), (pads[0][0], bottom), (pads[1][0], right)),
                   constant_values=fill)
    s = x.strides
    view = xp.lib.stride_tricks.as_strided(
        x, (n, c, kh, kw, ho, wo), (s[0], s[1], s[2] * dh, s[3] * dw, s[2] * sh, s[3] * sw))
    return x, view


def col2im(cols, padded_shape, pads, in_hw, stride, dilation):
    """The adjoint of the window view: cols (N, C, kh, kw, Ho, Wo) added into
    a zero padded input, returned without the padding (N, C, H, W)."""
    xp = xp_of(cols)
    n, c, kh, kw, ho, wo = cols.shape
    (sh, sw), (dh, dw) = stride, dilation
    out = xp.zeros(padded_shape, cols.dtype)
    for i in range(kh):
        for j in range(kw):
            out[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                j * dw:j * dw + sw * (wo - 1) + 1:sw] += cols[:, :, i, j]
    (top, _), (left, _) = pads
    return out[:, :, top:top + in_hw[0], left:left + in_hw[1]]


class Conv2d(Function):
    """out[n, o] = bias[o] + sum over the group's channels and the window of
    weight[o, c, i, j] · x_padded[n, c, ho·s + i·d, wo·s + j·d]."""

    def forward(self, x, weight, *bias, stride=(1, 1), pads=((0, 0), (0, 0)),
                dilation=(1, 1), groups=1):
        out_hw = conv_out_shape(x.shape, weight.shape, stride, pads, dilation)[2:]
        self.args = (stride, pads, dilation, groups)
        self.weight, self.x_shape = weight, x.shape
        self.has_bias = bool(bias)
        self.direct = self.winograd = self.pointwise = None
        self.col2im = kernels.lookup("conv2d", x, step="col2im")
        if winograd_takes(weight.shape, stride, dilation, groups):
            steps = [kernels.lookup("conv2d", x, weight, *bias, step=step) for step in
                     ("winograd_forward", "winograd_backward")]
            # stride-1 3x3 on many channels: no columns; None: x holds an inf, a NaN
            # or a value too large for Winograd's sums
            done = steps[0](x, weight, bias[0] if bias else None, pads, out_hw) \
                if all(steps) else None
            if done is not None:
                self.cols, self.winograd = None, steps[1]
                out, self.winograd_saved = done
                return out
        if pointwise_takes(weight.shape, pads, groups):  # 1x1: a GEMM per image, no columns
            self.cols, self.pointwise = None, pointwise.sampled(x, stride, out_hw)
            return pointwise.forward(self.pointwise, weight, bias[0] if bias else None)
        if conv_direct_takes(weight.shape, stride):
            self.direct = [kernels.lookup("conv2d", x, weight, *bias, step=step) for step in
                           ("direct_forward", "direct_weight_grad", "direct_input_grad")]
        if self.direct and all(self.direct):  # few input channels: no columns
            self.cols = None
            self.xflat, self.wp = conv_direct.padded_flat(x, weight.shape[2:], pads, dilation,
                                                          out_hw)
            return self.direct[0](self.xflat, self.wp, weight, bias[0] if bias else None,
                                  out_hw, dilation, groups)
        self.direct = None
        self.cols = columns(x, weight.shape[2:], stride, pads, dilation, out_hw, groups)
        return columns_product(self.cols, weight, groups, bias[0] if bias else None)

    def backward(self, g):
        stride, pads, dilation, groups = self.args
        need = self.needs_input_grad
        gw = gx = gb = None
        if self.winograd:
            saved, self.winograd_saved = self.winograd_saved, None
            grads = self.winograd(g, saved, self.weight, pads, need[1], need[0])
            if grads is None:  # an inf, a NaN or a huge value in g: the columns' GEMM
                self.cols = columns(saved[0], self.weight.shape[2:], stride, pads, dilation,
                                    g.shape[2:], groups)
                grads = self._gemm_backward(g)
            gw, gx = grads
        elif self.pointwise is not None:
            xs, self.pointwise = self.pointwise, None
            gw = pointwise.weight_grad(g, xs) if need[1] else None
            gx = pointwise.input_grad(g, self.weight, self.x_shape, stride) if need[0] else None
        elif self.direct:
            gw, gx = self._direct_backward(g)
        else:
            gw, gx = self._gemm_backward(g)
        if self.has_bias:
            gb = g.sum(axis=(0, 2, 3)) if need[2] else None
            return gx, gw, gb
        return gx, gw

    def _direct_backward(self, g):
        stride, pads, dilation, groups = self.args
        need = self.needs_input_grad
        xflat, self.xflat = self.xflat, None
        gw = gx = None
        if need[1]:
            gw = self.direct[1](xflat, self.wp, g, self.weight.shape, dilation, groups)
        if need[0] and conv_direct_input_takes(self.weight.shape, pads, dilation, groups):
            gx = self.direct[2](g, self.weight, self.x_shape[2:], pads, dilation, groups)
        elif need[0]:  # the GEMM and col2im
            gx = columns_grad(by_channel(g, groups), self.weight, self.x_shape, g.shape[2:],
                              stride, pads, dilation, self.col2im)
        return gw, gx

    def _gemm_backward(self, g):
        stride, pads, dilation, groups = self.args
        need = self.needs_input_grad
        g_t = by_channel(g, groups)
        gw = gx = None
        if need[1]:
            gw = weight_grad(g_t, self.cols, self.weight.shape)
        self.cols = None  # the largest saved array: free it before the input gradient
        if need[0]:
            gx = columns_grad(g_t, self.weight, self.x_shape, g.shape[2:], stride, pads,
                              dilation, self.col2im)
        return gw, gx


def _same_pads(kernel, dilation):
    """PyTorch's 'same': total d·(k-1), the extra one on the right/bottom."""
    total = dilation * (kernel - 1)
    return total // 2, total - total // 2


def conv_pads(padding, kernel_hw, stride, dilation, name="conv2d"):
    """((top, bottom), (left, right)) from an int, a pair, 'valid' or 'same'."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0), (0, 0)
        if padding != "same":
            raise ValueError(f"Invalid padding string {padding!r}, should be one of "
                             "{'valid', 'same'}")
        if stride != (1, 1):
            raise ValueError(f"{name}: padding='same' is not supported for strided "
                             f"convolutions (stride {stride})")
        return tuple(_same_pads(k, d) for k, d in zip(kernel_hw, dilation))
    ph, pw = _pair(padding, "padding")
    if ph < 0 or pw < 0:
        raise RuntimeError(f"{name}: negative padding is not supported, got {(ph, pw)}")
    return (ph, ph), (pw, pw)


def batched(input, weight, name):  # noqa: A002
    """(input as a 4-D Tensor, whether it came unbatched): PyTorch's 2-D
    convolutions take (C, H, W) as one sample; anything else but 4-D, or a
    weight that is not 4-D, is a RuntimeError naming both shapes."""
    x = as_tensor_like(input, weight)
    unbatched = x.ndim == 3
    if unbatched:
        x = x.unsqueeze(0)
    if x.ndim != 4 or weight.ndim != 4:
        raise RuntimeError(f"{name}: expected a 3-D or 4-D input and a 4-D weight, got input "
                           f"{tuple(input.shape)} and weight {tuple(weight.shape)}")
    return x, unbatched


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """PyTorch's ``F.conv2d``: input (N, C, H, W) or (C, H, W), weight
    (O, C/groups, kh, kw), bias (O,); padding an int, a pair, 'valid' or
    'same'."""
    x, unbatched = batched(input, weight, "conv2d")
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    if min(stride) < 1 or min(dilation) < 1 or groups < 1:
        raise RuntimeError(f"conv2d: stride {stride}, dilation {dilation} and groups "
                           f"{groups} must be positive")
    n, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    if c != cg * groups or o % groups:
        raise RuntimeError(f"conv2d: given groups={groups}, weight of size "
                           f"{list(weight.shape)}, expected input{list(x.shape)} to have "
                           f"{cg * groups} channels and {o} output channels divisible by "
                           f"groups, but got {c} channels")
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        raise RuntimeError(f"conv2d: input ({x.dtype}), weight ({weight.dtype}) and bias "
                           f"({None if bias is None else bias.dtype}) must have one dtype")
    if bias is not None and tuple(bias.shape) != (o,):
        raise RuntimeError(f"conv2d: bias must have shape ({o},), got {tuple(bias.shape)}")
    pads = conv_pads(padding, (kh, kw), stride, dilation)
    ho, wo = (out_size(s, p, k, st, d) for s, p, k, st, d in
              zip((h, w), pads, (kh, kw), stride, dilation))
    if ho < 1 or wo < 1:
        raise RuntimeError(f"conv2d: calculated output size ({ho}, {wo}) is too small for "
                           f"input {tuple(x.shape)}, kernel ({kh}, {kw}), padding {pads}, "
                           f"dilation {dilation}")
    args = (x, weight) if bias is None else (x, weight, bias)
    out = Conv2d.apply(*args, stride=stride, pads=pads, dilation=dilation, groups=groups)
    return out.squeeze(0) if unbatched else out


def _single(value, name):
    if isinstance(value, str):
        return value
    if not isinstance(value, int):
        value = tuple(value)
        if len(value) != 1:
            raise RuntimeError(f"conv1d: expected {name} to be a single integer, got {value}")
        value = value[0]
    return int(value)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """PyTorch's ``F.conv1d``: input (N, C, L) or (C, L), weight (O, C/groups,
    k); a conv2d over a height of one."""
    x = as_tensor_like(input, weight)
    if weight.ndim != 3 or x.ndim not in (2, 3):
        raise RuntimeError(f"conv1d: expected a 2-D or 3-D input and a 3-D weight, got input "
                           f"{tuple(x.shape)} and weight {tuple(weight.shape)}")
    padding = _single(padding, "padding")
    pad2 = padding if isinstance(padding, str) else (0, padding)
    out = conv2d(x.unsqueeze(-2), weight.unsqueeze(-2), bias, (1, _single(stride, "stride")),
                 pad2, (1, _single(dilation, "dilation")), groups)
    return out.squeeze(-2)


def conv_out_shape(x_shape, weight_shape, stride, pads, dilation):
    """(N, O, Ho, Wo) of a conv2d (used by the kernels and the benchmark)."""
    n, _, h, w = x_shape
    o, _, kh, kw = weight_shape
    return (n, o, out_size(h, pads[0], kh, stride[0], dilation[0]),
            out_size(w, pads[1], kw, stride[1], dilation[1]))


__all__ = ["Conv2d", "conv2d", "conv1d", "conv_pads", "padded_windows", "col2im",
           "conv_out_shape"]
