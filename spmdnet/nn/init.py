"""``nn.init``: PyTorch's in-place initialisers, drawn from spmdnet's generator.

Every ``*_`` function fills a Parameter or Tensor in place (its ``.array``,
NumPy or CuPy) outside autograd, so it works with or without
``no_grad``, and returns the tensor, as PyTorch. Values are drawn on the
host from ``spmdnet.random.generator()`` (``sn.manual_seed`` fixes them) and
copied to the tensor's device, so a seed gives the same weights on CPU and
GPU. ``generator=`` takes a ``numpy.random.Generator`` instead.

Fans and gains follow PyTorch: ``fan_in = size(1) * receptive field``,
``fan_out = size(0) * receptive field`` (the receptive field is the product
of the dims beyond the second); ``calculate_gain`` has PyTorch's table.
"""
import math
import numbers
import warnings

import numpy as np

from .._tensor import Tensor, get_default_dtype
from ..backend import xp_of
from ..random import generator as default_generator

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_",
           "zeros_", "eye_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
           "kaiming_normal_"]

_LINEAR = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "sigmoid")


def calculate_gain(nonlinearity, param=None):
    """PyTorch's recommended gain for ``nonlinearity`` (``param``: leaky_relu's slope)."""
    if nonlinearity in _LINEAR:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, numbers.Real) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _array(tensor):
    """The array an initialiser fills: a Tensor's ``.array``, or the array itself."""
    return tensor.array if isinstance(tensor, Tensor) else tensor


def _fill(tensor, host_values):
    """Copy host values into the tensor's array in place; returns the tensor."""
    arr = _array(tensor)
    arr[...] = xp_of(arr).asarray(host_values).astype(arr.dtype, copy=False)
    return tensor


def _gen(generator):
    return default_generator() if generator is None else generator


def _calculate_fan_in_and_fan_out(tensor):
    """(fan_in, fan_out) as PyTorch: dims beyond 2 multiply the receptive field."""
    shape = _array(tensor).shape
    if len(shape) < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer "
                         "than 2 dimensions")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


# -- fills ------------------------------------------------------------------------------
def uniform_(tensor, a=0.0, b=1.0, generator=None):
    """Fill with U(a, b)."""
    return _fill(tensor, _gen(generator).uniform(a, b, size=_array(tensor).shape))


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    """Fill with N(mean, std²)."""
    return _fill(tensor, mean + std * _gen(generator).standard_normal(_array(tensor).shape))


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Fill with N(mean, std²) truncated to [a, b]: ``a`` and ``b`` are ABSOLUTE
    bounds on the values (not multiples of std), as PyTorch's.

    Exact rejection sampling: redraw the values outside [a, b] (or, when
    [a, b] holds little of the mass, draw uniformly on [a, b] and accept with
    the normal density's ratio)."""
    if std <= 0 or not a < b:
        raise ValueError(f"trunc_normal_: need std > 0 and a < b, got std={std}, a={a}, b={b}")
    rng, shape = _gen(generator), _array(tensor).shape
    lo, hi = (a - mean) / std, (b - mean) / std
    mass = 0.5 * (math.erf(hi / math.sqrt(2)) - math.erf(lo / math.sqrt(2)))
    peak = min(max(0.0, lo), hi)  # where the standard density is largest on [lo, hi]
    out = np.empty(math.prod(shape))
    filled = 0
    while filled < out.size:
        need = out.size - filled
        if mass >= 0.25:
            z = rng.standard_normal(int(need / mass) + 16)
        else:
            z = rng.uniform(lo, hi, size=4 * need + 16)
            z = z[rng.random(z.size) < np.exp(0.5 * (peak * peak - z * z))]
        z = z[(z >= lo) & (z <= hi)][:need]
        out[filled:filled + z.size] = z
        filled += z.size
    return _fill(tensor, np.clip(mean + std * out.reshape(shape), a, b))


def constant_(tensor, val):
    """Fill with ``val``."""
    _array(tensor)[...] = val
    return tensor


def ones_(tensor):
    return constant_(tensor, 1.0)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def eye_(tensor):
    """The identity in a 2-D tensor (ones on the diagonal, zeros elsewhere)."""
    arr = _array(tensor)
    if arr.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return _fill(tensor, np.eye(*arr.shape))


# -- fan-scaled ---------------------------------------------------------------------------
def xavier_uniform_(tensor, gain=1.0, generator=None):
    """U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio)."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    """N(0, std²), std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def _kaiming_std(tensor, a, mode, nonlinearity):
    """std = gain / sqrt(fan), or None for a zero-element tensor (a no-op, as PyTorch)."""
    if 0 in _array(tensor).shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=3)
        return None
    fan = _calculate_correct_fan(tensor, mode)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """U(-bound, bound), bound = gain * sqrt(3 / fan) (He et al.); ``a``: the
    leaky_relu slope. ``Linear``'s default is ``a=sqrt(5)``: bound 1/sqrt(fan_in)."""
    std = _kaiming_std(tensor, a, mode, nonlinearity)
    if std is None:
        return tensor
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """N(0, std²), std = gain / sqrt(fan)."""
    std = _kaiming_std(tensor, a, mode, nonlinearity)
    return tensor if std is None else normal_(tensor, 0.0, std, generator)


# -- host-array helpers for layers built from slices (tensor parallelism) ------------------
def uniform(shape, bound, dtype=None):
    """A new host array drawn from U(-bound, bound) (not PyTorch's deprecated
    ``init.uniform``: use ``uniform_(tensor, a, b)`` on a tensor)."""
    if isinstance(shape, Tensor):
        raise TypeError("init.uniform(shape, bound) makes a new array; "
                        "use init.uniform_(tensor, a, b) to fill a tensor")
    dtype = dtype or get_default_dtype()
    return default_generator().uniform(-bound, bound, size=shape).astype(dtype)


def normal(shape, std=1.0, dtype=None):
    """A new host array drawn from N(0, std²) (use ``normal_`` to fill a tensor)."""
    if isinstance(shape, Tensor):
        raise TypeError("init.normal(shape, std) makes a new array; "
                        "use init.normal_(tensor, mean, std) to fill a tensor")
    dtype = dtype or get_default_dtype()
    return (default_generator().standard_normal(size=shape) * std).astype(dtype)


def default_layer_init_(weight, bias=None):
    """PyTorch's default init of Linear and Conv layers: weight
    kaiming_uniform_(a=sqrt(5)), bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = _calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        uniform_(bias, -bound, bound)
