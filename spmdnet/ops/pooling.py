"""Pooling, NCHW, PyTorch's semantics: ``max_pool2d`` (the gradient goes to
one element per window, the first maximum in the window's row-major order,
as PyTorch's), ``avg_pool2d`` (``ceil_mode``, ``count_include_pad``,
``divisor_override``), ``adaptive_avg_pool2d``, ``adaptive_max_pool2d`` and
``interpolate`` (mode 'nearest').

Windows are the strided view of ``ops.conv.padded_windows``; PyTorch's
output size (with ``ceil_mode``, the last window must start inside the
input or its left padding).
"""
from .. import kernels
from .._tensor import Tensor
from ..autograd import Function
from ..backend import scatter_add, xp_of
from .conv import _pair, col2im, padded_windows


def pool_out_size(size, kernel, stride, pad, dilation, ceil_mode):
    """PyTorch's pooling_output_shape."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _pool_args(name, x, kernel_size, stride, padding, dilation, ceil_mode):
    kernel = _pair(kernel_size, "kernel_size")
    stride = kernel if stride is None or stride == () or stride == [] else _pair(stride, "stride")
    padding, dilation = _pair(padding, "padding"), _pair(dilation, "dilation")
    if x.ndim not in (3, 4):
        raise RuntimeError(f"{name}: expected a 3-D or 4-D input, got {tuple(x.shape)}")
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1:
        raise RuntimeError(f"{name}: kernel_size {kernel}, stride {stride} and dilation "
                           f"{dilation} must be positive")
    if any(p < 0 or p > k // 2 for p, k in zip(padding, kernel)):
        raise RuntimeError(f"{name}: pad should be at most half of effective kernel size, "
                           f"but got pad={padding}, kernel_size={kernel}")
    out = tuple(pool_out_size(s, k, st, p, d, ceil_mode) for s, k, st, p, d in
                zip(x.shape[-2:], kernel, stride, padding, dilation))
    if min(out) < 1:
        raise RuntimeError(f"{name}: output size {out} is too small for input "
                           f"{tuple(x.shape)}, kernel {kernel}, padding {padding}")
    return kernel, stride, padding, dilation, out


def _windows(x, kernel, stride, padding, dilation, out, fill):
    """The padded input and its (N, C, kh, kw, Ho, Wo) view cut to ``out``."""
    pads = tuple((p, 0) for p in padding)  # the right side: out's windows decide
    padded, view = padded_windows(x, pads, kernel, stride, dilation, fill=fill)
    ho, wo = out
    h, w = x.shape[-2:]
    extra_h = max(padding[0], (ho - 1) * stride[0] + dilation[0] * (kernel[0] - 1) + 1
                  - h - padding[0])
    extra_w = max(padding[1], (wo - 1) * stride[1] + dilation[1] * (kernel[1] - 1) + 1
                  - w - padding[1])
    xp = xp_of(x)
    if extra_h or extra_w:  # bottom/right padding, and the ceil_mode overhang
        padded = xp.pad(padded, ((0, 0), (0, 0), (0, extra_h), (0, extra_w)),
                        constant_values=fill)
        s = padded.strides
        view = xp.lib.stride_tricks.as_strided(
            padded, view.shape[:4] + (ho, wo), (s[0], s[1], s[2] * dilation[0],
                                                s[3] * dilation[1], s[2] * stride[0],
                                                s[3] * stride[1]))
    return padded, view[..., :ho, :wo]


class MaxPool2d(Function):
    """The maximum of each window; ``self.indices`` are PyTorch's: flat
    positions h·W + w in each input channel."""

    def forward(self, x, kernel=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1),
                out=(1, 1)):
        xp = xp_of(x)
        n, c, h, w = x.shape
        kernel_fn = kernels.lookup("max_pool2d", x)
        if kernel_fn is not None:
            values, self.indices = kernel_fn(x, kernel, stride, padding, dilation, out)
        else:
            _, view = _windows(x, kernel, stride, padding, dilation, out, -xp.inf)
            ho, wo = out
            kh, kw = kernel
            wins = view.transpose(0, 1, 4, 5, 2, 3).reshape(n, c, ho, wo, kh * kw)
            arg = wins.argmax(axis=-1)  # the first maximum (NaN counts as the maximum)
            values = xp.take_along_axis(wins, arg[..., None], axis=-1)[..., 0]
            if any(padding):
                arg, inside = _first_inside(xp, arg, (h, w), kernel, stride, padding, dilation,
                                            out)
            i, j = arg // kw, arg % kw
            rows = (xp.arange(ho) * stride[0] - padding[0])[:, None] + i * dilation[0]
            cols = (xp.arange(wo) * stride[1] - padding[1])[None, :] + j * dilation[1]
            self.indices = rows * w + cols
            if any(padding):
                self.indices = xp.where(inside, self.indices, -1)
        self.shape = x.shape
        self.overlap = any(s < d * (k - 1) + 1 for s, k, d in zip(stride, kernel, dilation))
        return values

    def backward(self, g):
        xp = xp_of(g)
        n, c, h, w = self.shape
        flat = (self.indices + (xp.arange(n * c) * (h * w)).reshape(n, c, 1, 1)).ravel()
        g = g.ravel()
        gx = xp.zeros(n * c * h * w, g.dtype)
        if (self.indices < 0).any():  # windows wholly in the padding: their -inf took nothing
            keep = self.indices.ravel() >= 0
            flat, g = flat[keep], g[keep]
        if self.overlap:  # windows overlap: one element may be the max of several
            scatter_add(gx, flat, g)
        else:
            gx[flat] = g
        return gx.reshape(self.shape)


def _first_inside(xp, arg, hw, kernel, stride, padding, dilation, out):
    """(arg, inside): a window's argmax moved off the padding, whose -inf can
    win only when every tap inside is -inf too, to the first tap inside (as
    the kernel and PyTorch pick); inside (Ho, Wo): whether a window has a tap
    inside at all (one wholly in the padding gives -inf and index -1)."""
    taps = []
    for size, k, s, p, d, o in zip(hw, kernel, stride, padding, dilation, out):
        at = (xp.arange(o) * s - p)[:, None] + xp.arange(k) * d
        taps.append((at >= 0) & (at < size))  # (O, k)
    valid = (taps[0][:, None, :, None] & taps[1][None, :, None, :]).reshape(
        out[0], out[1], -1)
    chosen = valid[xp.arange(out[0])[:, None], xp.arange(out[1])[None, :], arg]
    return xp.where(chosen, arg, valid.argmax(axis=-1)), valid.any(axis=-1)


class AvgPool2d(Function):
    """The sum of each window over its divisor map (Ho, Wo)."""

    def forward(self, x, kernel=(2, 2), stride=(2, 2), padding=(0, 0), out=(1, 1),
                divisor=None):
        padded, view = _windows(x, kernel, stride, padding, (1, 1), out, 0.0)
        self.args = (padded.shape, ((padding[0], 0), (padding[1], 0)), x.shape[-2:], stride)
        self.divisor, self.kernel = divisor, kernel
        return view.sum(axis=(2, 3)) / divisor

    def backward(self, g):
        xp = xp_of(g)
        kh, kw = self.kernel
        cols = xp.broadcast_to((g / self.divisor)[:, :, None, None],
                               g.shape[:2] + (kh, kw) + g.shape[2:])
        padded_shape, pads, hw, stride = self.args
        return xp.ascontiguousarray(col2im(cols, padded_shape, pads, hw, stride, (1, 1)))


def _avg_divisor(xp, dtype, hw, kernel, stride, padding, out, count_include_pad):
    """PyTorch's divisor per output position: the window clipped to the padded
    input (count_include_pad) or to the input."""
    result = []
    for size, k, s, p, o in zip(hw, kernel, stride, padding, out):
        start = xp.arange(o) * s - p
        end = xp.minimum(start + k, size + p)
        if not count_include_pad:
            start, end = xp.maximum(start, 0), xp.minimum(end, size)
        result.append(end - start)
    return (result[0][:, None] * result[1][None, :]).astype(dtype)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode=False, return_indices=False):
    """PyTorch's ``F.max_pool2d``; ``return_indices``: also the int64 flat
    positions h·W + w of each maximum in its channel."""
    unbatched = input.ndim == 3
    x = input.unsqueeze(0) if unbatched else input
    kernel, stride, padding, dilation, out = _pool_args("max_pool2d", x, kernel_size, stride,
                                                        padding, dilation, ceil_mode)
    op = MaxPool2d.apply(x, kernel=kernel, stride=stride, padding=padding, dilation=dilation,
                         out=out)
    values = op.squeeze(0) if unbatched else op
    if not return_indices:
        return values
    idx = (op._ctx.indices if op._ctx is not None else _indices_again(x, kernel, stride,
                                                                        padding, dilation, out))
    idx = Tensor(idx.astype(xp_of(idx).int64))
    return values, (idx.squeeze(0) if unbatched else idx)


def _indices_again(x, kernel, stride, padding, dilation, out):
    """The indices when no graph was recorded (forward under no_grad)."""
    ctx = MaxPool2d()
    ctx.forward(x.array, kernel, stride, padding, dilation, out)
    return ctx.indices


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
               count_include_pad=True, divisor_override=None):
    """PyTorch's ``F.avg_pool2d``."""
    unbatched = input.ndim == 3
    x = input.unsqueeze(0) if unbatched else input
    kernel, stride, padding, _, out = _pool_args("avg_pool2d", x, kernel_size, stride,
                                                 padding, 1, ceil_mode)
    xp = xp_of(x.array)
    if divisor_override is not None:
        if divisor_override == 0:
            raise RuntimeError("avg_pool2d: divisor must be not zero")
        divisor = x.dtype.type(divisor_override)
    else:
        divisor = _avg_divisor(xp, x.dtype, x.shape[-2:], kernel, stride, padding, out,
                               count_include_pad)
    y = AvgPool2d.apply(x, kernel=kernel, stride=stride, padding=padding, out=out,
                       divisor=divisor)
    return y.squeeze(0) if unbatched else y


def adaptive_bounds(size, out):
    """PyTorch's adaptive windows: [floor(i·size/out), ceil((i+1)·size/out))."""
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


class AdaptiveAvgPool2d(Function):
    """out = Ph · x · Pwᵀ with the averaging matrices Ph (Ho, H), Pw (Wo, W);
    where the windows tile the input (H, W multiples of the output's: a
    global average pool), the mean of each window and the gradient spread
    over it: the product's thousands of tiny batched matmuls took 0.15 ms
    forward and 0.2 ms backward on ResNet-18's last (32, 128, 4, 4)."""

    def forward(self, x, out=(1, 1)):
        xp = xp_of(x)
        (h, w), self.window = x.shape[-2:], None
        if h % out[0] == 0 and w % out[1] == 0:
            self.window = (h // out[0], w // out[1])
            tiles = x.reshape(x.shape[:-2] + (out[0], self.window[0], out[1], self.window[1]))
            return tiles.mean(axis=(-3, -1))
        mats = []
        for size, o in zip(x.shape[-2:], out):
            m = xp.zeros((o, size), x.dtype)
            for i, (a, b) in enumerate(adaptive_bounds(size, o)):
                m[i, a:b] = 1.0 / (b - a)
            mats.append(m)
        self.ph, self.pw = mats
        return xp.matmul(xp.matmul(self.ph, x), self.pw.T)

    def backward(self, g):
        xp = xp_of(g)
        if self.window is not None:
            (kh, kw), (ho, wo) = self.window, g.shape[-2:]
            share = g * g.dtype.type(1.0 / (kh * kw))
            spread = xp.broadcast_to(share[..., :, None, :, None], g.shape[:-2] + (ho, kh, wo, kw))
            return xp.ascontiguousarray(spread).reshape(g.shape[:-2] + (ho * kh, wo * kw))
        return xp.matmul(xp.matmul(self.ph.T, g), self.pw)


class AdaptiveMaxPool2d(MaxPool2d):
    """The maximum of each adaptive window (one Python step per output
    position: outputs are small); the gradient as MaxPool2d's."""

    def forward(self, x, out=(1, 1)):
        xp = xp_of(x)
        n, c, h, w = x.shape
        values = xp.empty((n, c) + tuple(out), x.dtype)
        self.indices = xp.empty((n, c) + tuple(out), xp.int64)
        for i, (h0, h1) in enumerate(adaptive_bounds(h, out[0])):
            for j, (w0, w1) in enumerate(adaptive_bounds(w, out[1])):
                win = x[:, :, h0:h1, w0:w1].reshape(n, c, -1)
                arg = win.argmax(axis=-1)
                values[:, :, i, j] = xp.take_along_axis(win, arg[..., None], axis=-1)[..., 0]
                self.indices[:, :, i, j] = (h0 + arg // (w1 - w0)) * w + w0 + arg % (w1 - w0)
        self.shape, self.overlap = x.shape, True
        return values


def _adaptive_out(name, x, output_size):
    if x.ndim not in (3, 4):
        raise RuntimeError(f"{name}: expected a 3-D or 4-D input, got {tuple(x.shape)}")
    out = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    if len(out) != 2:
        raise RuntimeError(f"{name}: output_size must be an int or a pair, got {output_size}")
    out = tuple(x.shape[-2 + k] if o is None else int(o) for k, o in enumerate(out))
    if min(out) < 1 or min(x.shape[-2:]) < 1:
        raise RuntimeError(f"{name}: output size {out} and input {tuple(x.shape)} must be "
                           "non-empty")
    return out


def adaptive_avg_pool2d(input, output_size):  # noqa: A002
    """PyTorch's ``F.adaptive_avg_pool2d``; None in output_size keeps that size."""
    out = _adaptive_out("adaptive_avg_pool2d", input, output_size)
    return AdaptiveAvgPool2d.apply(input, out=out)


def adaptive_max_pool2d(input, output_size, return_indices=False):  # noqa: A002
    """PyTorch's ``F.adaptive_max_pool2d``."""
    out = _adaptive_out("adaptive_max_pool2d", input, output_size)
    unbatched = input.ndim == 3
    x = input.unsqueeze(0) if unbatched else input
    op = AdaptiveMaxPool2d.apply(x, out=out)
    values = op.squeeze(0) if unbatched else op
    if not return_indices:
        return values
    if op._ctx is not None:
        idx = op._ctx.indices
    else:
        ctx = AdaptiveMaxPool2d()
        ctx.forward(x.array, out)
        idx = ctx.indices
    return values, Tensor(idx[0] if unbatched else idx)


def interpolate(input, size=None, scale_factor=None, mode="nearest",  # noqa: A002
                align_corners=None, recompute_scale_factor=None, antialias=False):
    """PyTorch's ``F.interpolate``, mode 'nearest' only, on (N, C, L),
    (N, C, H, W) or (N, C, D, H, W): source index floor(i · in / out)
    (floor(i / scale_factor) when scale_factor is given)."""
    if mode != "nearest":
        raise NotImplementedError(f"interpolate: only mode='nearest' is supported, got "
                                  f"{mode!r}")
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    dims = input.ndim - 2
    if dims < 1:
        raise ValueError(f"interpolate: expected input of at least 3 dims, got "
                         f"{tuple(input.shape)}")
    xp = xp_of(input.array)
    ins = input.shape[2:]
    if size is not None:
        outs = (size,) * dims if isinstance(size, int) else tuple(size)
        scales = [i / o for i, o in zip(ins, outs)]
    else:
        factors = ((scale_factor,) * dims if isinstance(scale_factor, (int, float))
                   else tuple(scale_factor))
        outs = tuple(int(i * f) for i, f in zip(ins, factors))
        scales = [i / o if recompute_scale_factor else 1.0 / f
                  for i, o, f in zip(ins, outs, factors)]
    if len(outs) != dims:
        raise ValueError(f"interpolate: size {outs} must have {dims} entries")
    index = [slice(None), slice(None)]
    for k, (n_in, n_out, s) in enumerate(zip(ins, outs, scales)):
        src = xp.minimum(xp.floor(xp.arange(n_out) * s).astype(xp.int64), n_in - 1)
        shape = [1] * dims
        shape[k] = n_out
        index.append(src.reshape(shape))
    return input[tuple(index)]
