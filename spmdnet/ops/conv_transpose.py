"""Transposed convolutions, NCHW, PyTorch's semantics: ``conv_transpose2d``
and ``conv_transpose1d`` (a 2-D one over a height of one).

A transposed convolution is the input gradient of the convolution with the
same weight, stride, padding, dilation and groups, whose input has the
transposed convolution's output size: forward is ``ops.conv_columns.columns_grad``
(``weightᵀ @ x`` as columns, scattered back by the conv kernels' col2im),
and backward is that convolution (``ops.conv_columns.columns`` of the output
gradient, then one GEMM for the input gradient and one for the weight
gradient). The weight is PyTorch's (in, out/groups, kh, kw): the
convolution's (out, in/groups, kh, kw) read the other way round.
"""
from .. import kernels
from ..autograd import Function
from .arith import as_tensor_like
from .conv import _pair, _single, batched
from .conv_columns import by_channel, columns, columns_grad, columns_product, weight_grad


class ConvTranspose2d(Function):
    """out = the adjoint of conv2d(·, weight) applied to x, plus bias:
    out[n, g·O/G + o, h·s - p + i·d, w·s - p + j·d] += x[n, c, h, w] ·
    weight[c, o, i, j] for c in group g."""

    def forward(self, x, weight, *bias, stride=(1, 1), pads=((0, 0), (0, 0)),
                dilation=(1, 1), groups=1, out_hw=(1, 1)):
        col2im = kernels.lookup("conv2d", x, step="col2im")
        n, c_in = x.shape[:2]
        out_shape = (n, weight.shape[1] * groups) + tuple(out_hw)
        self.x_t = by_channel(x, groups)  # (G, in/G, N·H·W): the weight gradient's operand
        self.args = (stride, pads, dilation, groups)
        self.weight, self.in_hw, self.has_bias = weight, x.shape[2:], bool(bias)
        out = columns_grad(self.x_t, weight, out_shape, x.shape[2:], stride, pads, dilation,
                           col2im)
        if bias:
            out += bias[0].reshape(1, -1, 1, 1)
        return out

    def backward(self, g):
        stride, pads, dilation, groups = self.args
        need = self.needs_input_grad
        gx = gw = gb = None
        if need[0] or need[1]:
            cols = columns(g, self.weight.shape[2:], stride, pads, dilation, self.in_hw,
                           groups)
            if need[0]:
                gx = columns_product(cols, self.weight, groups)
            if need[1]:
                gw = weight_grad(self.x_t, cols, self.weight.shape)
        if self.has_bias:
            gb = g.sum(axis=(0, 2, 3)) if need[2] else None
            return gx, gw, gb
        return gx, gw


def transposed_out_size(size, kernel, stride, pad, dilation, output_padding):
    """PyTorch's output size: (size - 1)·s - 2p + d·(k - 1) + output_padding + 1."""
    return (size - 1) * stride - 2 * pad + dilation * (kernel - 1) + output_padding + 1


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0,  # noqa: A002
                     output_padding=0, groups=1, dilation=1):
    """PyTorch's ``F.conv_transpose2d``: input (N, C_in, H, W) or (C_in, H,
    W), weight (C_in, C_out/groups, kh, kw), bias (C_out,)."""
    x, unbatched = batched(input, weight, "conv_transpose2d")
    if isinstance(padding, str):
        raise RuntimeError(f"conv_transpose2d: padding must be an int or a pair, got "
                           f"{padding!r} (PyTorch has no string padding here)")
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    padding, output_padding = _pair(padding, "padding"), _pair(output_padding,
                                                                 "output_padding")
    if min(stride) < 1 or min(dilation) < 1 or groups < 1 or min(padding) < 0:
        raise RuntimeError(f"conv_transpose2d: stride {stride}, dilation {dilation} and "
                           f"groups {groups} must be positive, padding {padding} not negative")
    for op, s, d in zip(output_padding, stride, dilation):
        if op < 0 or op >= max(s, d):
            raise RuntimeError(f"conv_transpose2d: output padding {output_padding} must be "
                               f"smaller than either stride {stride} or dilation {dilation}")
    c_in, og, kh, kw = weight.shape
    if x.shape[1] != c_in or c_in % groups:
        raise RuntimeError(f"conv_transpose2d: given groups={groups}, weight of size "
                           f"{list(weight.shape)}, expected input{list(x.shape)} to have "
                           f"{c_in} channels (divisible by groups)")
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        raise RuntimeError(f"conv_transpose2d: input ({x.dtype}), weight ({weight.dtype}) "
                           f"and bias ({None if bias is None else bias.dtype}) must have one "
                           "dtype")
    if bias is not None and tuple(bias.shape) != (og * groups,):
        raise RuntimeError(f"conv_transpose2d: bias must have shape ({og * groups},), got "
                           f"{tuple(bias.shape)}")
    out_hw = tuple(transposed_out_size(*a) for a in zip(x.shape[2:], (kh, kw), stride,
                                                          padding, dilation, output_padding))
    if min(out_hw) < 1:
        raise RuntimeError(f"conv_transpose2d: calculated output size {out_hw} is too small "
                           f"for input {tuple(x.shape)}, kernel ({kh}, {kw}), padding "
                           f"{padding}, dilation {dilation}")
    args = (x, weight) if bias is None else (x, weight, bias)
    out = ConvTranspose2d.apply(*args, stride=stride, pads=tuple((p, p) for p in padding),
                                dilation=dilation, groups=groups, out_hw=out_hw)
    return out.squeeze(0) if unbatched else out


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0,  # noqa: A002
                     output_padding=0, groups=1, dilation=1):
    """PyTorch's ``F.conv_transpose1d``: input (N, C_in, L) or (C_in, L),
    weight (C_in, C_out/groups, k); a 2-D one over a height of one."""
    x = as_tensor_like(input, weight)
    if weight.ndim != 3 or x.ndim not in (2, 3):
        raise RuntimeError(f"conv_transpose1d: expected a 2-D or 3-D input and a 3-D weight, "
                           f"got input {tuple(x.shape)} and weight {tuple(weight.shape)}")
    one = {name: (1, _single(value, name)) for name, value in
           (("stride", stride), ("dilation", dilation))}
    zero = {name: (0, _single(value, name)) for name, value in
            (("padding", padding), ("output_padding", output_padding))}
    out = conv_transpose2d(x.unsqueeze(-2), weight.unsqueeze(-2), bias, one["stride"],
                           zero["padding"], zero["output_padding"], groups, one["dilation"])
    return out.squeeze(-2)


__all__ = ["ConvTranspose2d", "conv_transpose2d", "conv_transpose1d", "transposed_out_size"]
