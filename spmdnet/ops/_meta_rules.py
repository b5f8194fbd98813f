"""Shape rules of the ops whose forward would do the data's work on meta
inputs (autograd/meta.py calls them in place of forward): windows through
``as_strided`` (convolutions, pooling), the recurrences' time loops, and
activations whose forward strips ``MetaArray`` (``erf`` and friends on plain
arrays) or allocates its result. Registered by op class, so a renamed or
moved op fails here at import rather than losing its rule. Attention
registers its own (attention.py).
"""
import numpy as np

from ..autograd.meta import register_elementwise, register_shape_rule
from . import activations, nn_ops, pooling, rnn, unary
from .conv import Conv2d, conv_out_shape
from .conv_transpose import ConvTranspose2d


def _conv2d(x, weight, *bias, stride=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1), **_):
    return (conv_out_shape(x.shape, weight.shape, stride, pads, dilation),
            np.result_type(x, weight))


def _conv_transpose2d(x, weight, *bias, groups=1, out_hw=(1, 1), **_):
    return (x.shape[0], weight.shape[1] * groups) + tuple(out_hw), np.result_type(x, weight)


def _pool(x, out=(1, 1), **_):
    return x.shape[:-2] + tuple(out), x.dtype


def _states(xw, h0, *_, **__):
    """ElmanSequence, GRUSequence: the states (T, N, H)."""
    return xw.shape[:2] + (h0.shape[-1],), xw.dtype


def _lstm(xw, h0, c0, *_, **__):
    """LSTMSequence: the states (T, N, H) and the last cell state, one more row."""
    return (xw.shape[0] + 1, xw.shape[1], h0.shape[-1]), xw.dtype


def _embedding(weight, indices, **_):
    return indices.shape + weight.shape[1:], weight.dtype


register_shape_rule(Conv2d, _conv2d)
register_shape_rule(ConvTranspose2d, _conv_transpose2d)
for _op in (pooling.MaxPool2d, pooling.AvgPool2d, pooling.AdaptiveMaxPool2d,
            pooling.AdaptiveAvgPool2d):
    register_shape_rule(_op, _pool)
register_shape_rule(rnn.ElmanSequence, _states)
register_shape_rule(rnn.GRUSequence, _states)
register_shape_rule(rnn.LSTMSequence, _lstm)
register_shape_rule(nn_ops.Embedding, _embedding)
for _op in (unary.Exp, unary.Log, unary.Log1p, unary.Sqrt, unary.Rsqrt, unary.Sin, unary.Cos,
            unary.Abs, unary.Clamp, unary.ReLU, unary.Tanh, unary.Sigmoid, unary.GELU,
            activations.SiLU, activations.LeakyReLU, activations.ELU, activations.Softplus,
            activations.Hardtanh):
    register_elementwise(_op)
