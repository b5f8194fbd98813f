"""Ops on meta tensors (PyTorch's ``device("meta")``): ``Function.apply``
runs an op whose inputs include a meta tensor here.

Forward: the few ops that compute on plain arrays they derive from their
inputs (windows through ``as_strided``: convolutions, pooling) give their
result's shape by a rule in ``RULES``; any other op's forward runs on the
inputs' ``MetaArray``s, whose NumPy is shape-only (``_meta.py``), and what it
returns is kept as shape and dtype only. Backward never runs the op's own:
each input's gradient is a meta array of that input's shape and dtype, so
``loss.backward()`` on a meta graph gives meta gradients, as PyTorch's.
An op that cannot run shape-only raises NotImplementedError naming it.
"""
import numpy as np

from .. import _precision
from .._meta import MetaArray, meta_array, reading_placeholders


def any_meta(arrays):
    """Whether any array is a ``MetaArray`` (asked of every op: kept cheap)."""
    for a in arrays:
        if type(a) is MetaArray:  # meta arrays are never subclassed further
            return True
    return False


def _conv_size(n, k, stride, pad, dilation):
    return (n + sum(pad) - dilation * (k - 1) - 1) // stride + 1


def _conv2d(x, weight, *bias, stride=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1), **_):
    hw = tuple(_conv_size(n, k, s, p, d) for n, k, s, p, d in
               zip(x.shape[2:], weight.shape[2:], stride, pads, dilation))
    return (x.shape[0], weight.shape[0]) + hw, np.result_type(x, weight)


def _conv_transpose2d(x, weight, *bias, groups=1, out_hw=(1, 1), **_):
    return (x.shape[0], weight.shape[1] * groups) + tuple(out_hw), np.result_type(x, weight)


def _pool(x, out=(1, 1), **_):
    return x.shape[:-2] + tuple(out), x.dtype


# op class name -> (input arrays, keyword arguments) -> (result shape, dtype)
RULES = {"Conv2d": _conv2d, "ConvTranspose2d": _conv_transpose2d, "MaxPool2d": _pool,
         "AvgPool2d": _pool, "AdaptiveMaxPool2d": _pool, "AdaptiveAvgPool2d": _pool}


def _forward(ctx, arrays, kwargs):
    rule = RULES.get(type(ctx).__name__)
    if rule is not None:
        return meta_array(*rule(*arrays, **kwargs))
    with reading_placeholders():
        out = _precision.forward(ctx, arrays, kwargs)
    return meta_array(out.shape, out.dtype)


def forward(ctx, arrays, kwargs, record):
    """The op's result on meta inputs: a ``MetaArray`` of its shape and dtype;
    when the graph is recorded, its backward gives meta gradients."""
    try:
        out = _forward(ctx, arrays, kwargs)
    except NotImplementedError as e:
        raise NotImplementedError(f"{type(ctx).__name__} on the 'meta' device: {e}") from e
    if record:
        need, inputs = ctx.needs_input_grad, [(a.shape, a.dtype) for a in arrays]
        ctx.__dict__.clear()  # nothing saved: the gradients are shapes too
        ctx.needs_input_grad = need
        ctx.backward = lambda grad: tuple(meta_array(*i) if n else None
                                          for i, n in zip(inputs, need))
    return out
