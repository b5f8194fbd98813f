"""``nn.init``: PyTorch's in-place initialisers, drawing PyTorch's numbers.

Every ``*_`` function fills a Parameter or Tensor in place (its ``.array``,
NumPy or CuPy) outside autograd, so it works with or without
``no_grad``, and returns the tensor, as PyTorch. Values are drawn on the
host from PyTorch's CPU stream (``spmdnet.random``: after the same
``manual_seed`` PyTorch's values, bitwise) and copied to the tensor's device,
so a seed gives the same weights on CPU and GPU. ``generator=`` takes a
``spmdnet.Generator``.

Fans and gains follow PyTorch: ``fan_in = size(1) * receptive field``,
``fan_out = size(0) * receptive field`` (the receptive field is the product
of the dims beyond the second); ``calculate_gain`` has PyTorch's table.
"""
import math
import numbers
import warnings

import numpy as np

from .._device import is_meta_array
from .._tensor import Tensor, get_default_dtype
from ..backend import xp_of
from .. import random as sn_random
from ..random import distributions

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_",
           "zeros_", "eye_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
           "kaiming_normal_", "orthogonal_", "sparse_", "dirac_"]

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


def _gen(generator, where):
    return sn_random.resolve(generator, where)


def _on_meta(tensor):
    """Whether the tensor is on the meta device: an initialiser then returns
    it untouched and draws nothing, as PyTorch's meta kernels (so a model
    built on meta leaves the generator where it was)."""
    return is_meta_array(_array(tensor))


def _dtype(tensor):
    return _array(tensor).dtype


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
    if _on_meta(tensor):
        return tensor
    g = _gen(generator, "uniform_")
    return _fill(tensor, distributions.uniform(g, _array(tensor).shape, a, b, _dtype(tensor)))


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    """Fill with N(mean, std²)."""
    if _on_meta(tensor):
        return tensor
    g = _gen(generator, "normal_")
    return _fill(tensor, distributions.normal(g, _array(tensor).shape, mean, std,
                                              _dtype(tensor)))


def _norm_cdf(x):
    return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Fill with N(mean, std²) truncated to [a, b]: ``a`` and ``b`` are ABSOLUTE
    bounds on the values (not multiples of std), as PyTorch's.

    Exact rejection sampling with PyTorch's draws: when [a, b] holds more
    than 0.3 of the mass, whole-tensor normals, redrawing (a whole tensor
    each round) where a value falls outside; else uniforms on [a, b],
    accepted where log(u) < the log density ratio, u a second uniform."""
    if std <= 0 or not a < b:
        raise ValueError(f"trunc_normal_: need std > 0 and a < b, got std={std}, a={a}, b={b}")
    if (mean < a - 2 * std) or (mean > b + 2 * std):
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. "
                      "The distribution of values may be incorrect.", stacklevel=2)
    if _on_meta(tensor):
        return tensor
    g, shape, dtype = _gen(generator, "trunc_normal_"), _array(tensor).shape, _dtype(tensor)
    if _norm_cdf((b - mean) / std) - _norm_cdf((a - mean) / std) > 0.3:
        lo, hi = dtype.type(a), dtype.type(b)
        result = distributions.normal(g, shape, mean, std, dtype)
        while np.any(outside := (result < lo) | (result > hi)):
            result = np.where(outside, distributions.normal(g, shape, mean, std, dtype), result)
        return _fill(tensor, result)
    log_peak = -0.5 * ((max(a, min(mean, b)) - mean) / std) ** 2
    kind = dtype.type

    def excess(values):  # log density ratio, computed as PyTorch's in-place chain
        return ((values - kind(mean)) / kind(std)) ** 2 * kind(-0.5) - kind(log_peak)

    result = distributions.uniform(g, shape, a, b, dtype)
    pending = np.log(distributions.uniform(g, shape, 0.0, 1.0, dtype)) > excess(result)
    while pending.any():
        candidates = distributions.uniform(g, shape, a, b, dtype)
        result = np.where(pending, candidates, result)
        accept = np.log(distributions.uniform(g, shape, 0.0, 1.0, dtype)) > excess(candidates)
        pending = np.where(pending, accept, pending)
    return _fill(tensor, result)


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
    bound = math.sqrt(3.0) * (gain * math.sqrt(2.0 / float(fan_in + fan_out)))
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


def orthogonal_(tensor, gain=1, generator=None):
    """A (semi-)orthogonal matrix, as PyTorch's: normals over (rows, the
    rest), QR of it (transposed when wide), Q's columns signed by R's
    diagonal, times ``gain``. The draws are PyTorch's; LAPACK's QR agrees
    with PyTorch's to rounding, not bitwise."""
    arr = _array(tensor)
    if arr.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if arr.size == 0 or _on_meta(tensor):
        return tensor
    rows = arr.shape[0]
    cols = arr.size // rows
    flat = distributions.normal(_gen(generator, "orthogonal_"), (rows, cols), 0.0, 1.0,
                                arr.dtype)
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return _fill(tensor, (q * gain).reshape(arr.shape))


def sparse_(tensor, sparsity, std=0.01, generator=None):
    """A 2-D tensor of N(0, std²) values with ``ceil(sparsity * rows)`` zeros
    per column, chosen by one ``randperm(rows)`` per column. As PyTorch's,
    only the normals come from ``generator``: the permutations from the
    current stream."""
    arr = _array(tensor)
    if arr.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    rows, cols = arr.shape
    num_zeros = int(math.ceil(sparsity * rows))
    if _on_meta(tensor):
        return tensor
    g = _gen(generator, "sparse_")
    values = distributions.normal(g, arr.shape, 0.0, std, arr.dtype)
    for col in range(cols):
        values[distributions.randperm(sn_random.generator(), rows)[:num_zeros], col] = 0
    return _fill(tensor, values)


def dirac_(tensor, groups=1):
    """The Dirac delta in a {3, 4, 5}-D convolution weight: each output
    channel passes its input channel through (per group), as PyTorch's."""
    arr = _array(tensor)
    if arr.ndim not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    if arr.shape[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    out_per_group = arr.shape[0] // groups
    values = np.zeros(arr.shape, arr.dtype)
    centre = tuple(k // 2 for k in arr.shape[2:])
    for g in range(groups):
        for d in range(min(out_per_group, arr.shape[1])):
            values[(g * out_per_group + d, d) + centre] = 1
    return _fill(tensor, values)


# -- host-array helpers for layers built from slices (tensor parallelism) ------------------
def uniform(shape, bound, dtype=None):
    """A new host array drawn from U(-bound, bound) (not PyTorch's deprecated
    ``init.uniform``: use ``uniform_(tensor, a, b)`` on a tensor)."""
    if isinstance(shape, Tensor):
        raise TypeError("init.uniform(shape, bound) makes a new array; "
                        "use init.uniform_(tensor, a, b) to fill a tensor")
    dtype = np.dtype(dtype or get_default_dtype())
    return distributions.uniform(sn_random.generator(), tuple(shape), -bound, bound, dtype)


def normal(shape, std=1.0, dtype=None):
    """A new host array drawn from N(0, std²) (use ``normal_`` to fill a tensor)."""
    if isinstance(shape, Tensor):
        raise TypeError("init.normal(shape, std) makes a new array; "
                        "use init.normal_(tensor, mean, std) to fill a tensor")
    dtype = np.dtype(dtype or get_default_dtype())
    return distributions.normal(sn_random.generator(), tuple(shape), 0.0, std, dtype)


def default_layer_init_(weight, bias=None):
    """PyTorch's default init of Linear and Conv layers: weight
    kaiming_uniform_(a=sqrt(5)), bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = _calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        uniform_(bias, -bound, bound)
