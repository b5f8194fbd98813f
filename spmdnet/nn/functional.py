"""The functional API (PyTorch's ``torch.nn.functional``), PyTorch's names,
signatures and semantics: ``import spmdnet.nn.functional as F`` and
``import spmdnet.functional as F`` give this one module.

Thin wrappers over the ops in ``spmdnet.ops``: they check arguments and turn
Python values into tensors; the math lives in the ops. The losses' and the
newer activations' wrappers sit next to their ops (ops/losses.py,
ops/pointwise_losses.py, ops/activations.py), as does attention's
(ops/attention.py, which draws its dropout mask); they are re-exported here.
docs/PYTORCH.md lists the differences from torch.nn.functional.
"""
import math
import warnings

import numpy as np

from .._meta import is_meta_array, meta_array
from .._tensor import Tensor
from ..backend import xp_of
from ..random import distributions, generator_for
from ..ops import (
    GELU,
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    LinearAct,
    LogSoftmax,
    Normalize,
    Pad,
    Softmax,
    as_tensor_like,
    exp,
    log,
    matmul,
    relu as _relu,
    sigmoid,
    sqrt,
    tanh,
)
from ..ops._util import dim_arg, normalize_axes
from ..ops.attention import scaled_dot_product_attention
from ..ops.activations import elu, hardtanh, leaky_relu, relu6, silu, softplus
from ..ops.batchnorm import batch_norm
from ..ops.group_norm import group_norm, instance_norm
from ..ops.convert import cast
from ..ops.conv import conv1d, conv2d
from ..ops.conv_transpose import conv_transpose1d, conv_transpose2d
from ..ops.pooling import (
    adaptive_avg_pool2d,
    adaptive_max_pool2d,
    avg_pool2d,
    interpolate,
    max_pool2d,
)
from ..ops.index import concatenate, stack
from ..ops.losses import cross_entropy, nll_loss
from ..ops.pointwise_losses import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    l1_loss,
    mse_loss,
    smooth_l1_loss,
)
from ..ops.huber_kl_losses import huber_loss, kl_div

__all__ = ["linear", "relu", "tanh", "sigmoid", "gelu", "silu", "leaky_relu", "elu",
           "softplus", "exp", "log", "sqrt", "matmul", "softmax", "log_softmax",
           "cross_entropy", "nll_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "mse_loss", "l1_loss", "smooth_l1_loss",
           "huber_loss", "kl_div", "hardtanh", "relu6",
           "dropout", "layer_norm", "embedding", "one_hot", "pad", "normalize",
           "scaled_dot_product_attention", "concatenate", "stack",
           "conv1d", "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
           "adaptive_max_pool2d", "interpolate", "batch_norm"]
__all__ += ["group_norm", "instance_norm"]
__all__ += ["conv_transpose1d", "conv_transpose2d"]
__all__ += ["dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"]

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "tanh", "sigmoid")
PAD_MODES = ("constant", "reflect", "replicate", "circular")


# -- layers and activations -----------------------------------------------------------------
def linear(input, weight, bias=None, activation=None):  # noqa: A002 - PyTorch's names
    """input @ weight.T + bias, weight of shape (out_features, in_features).

    ``activation`` (one of ``ACTIVATIONS``; "gelu_tanh" is
    ``gelu(approximate="tanh")``; not in PyTorch) applies it in the same op:
    the same values as ``F.relu(F.linear(x, w, b))``, with one pass over the
    output instead of three (``nn.Sequential`` fuses Linear + activation)."""
    x = as_tensor_like(input, weight)
    args = (x, weight) if bias is None else (x, weight, bias)
    if activation is None:
        return Linear.apply(*args)
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be None or one of {ACTIVATIONS}, "
                         f"got {activation!r}")
    return LinearAct.apply(*args, activation=activation)


def relu(input, inplace=False):  # noqa: A002
    """max(input, 0). ``inplace=True`` computes out of place (use the result)."""
    return _relu(input)


def gelu(input, approximate="none"):  # noqa: A002
    """x·Φ(x); ``approximate="tanh"`` uses the tanh formula."""
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return GELU.apply(input, approximate=approximate)


def _softmax_dim(name, ndim, stacklevel):
    """PyTorch's implicit dim (deprecated there, with this warning)."""
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the "
                  "call to include dim=X as an argument.", UserWarning, stacklevel=stacklevel)
    return 0 if ndim in (0, 1, 3) else 1


def _softmax(cls, name, input, dim, stacklevel, dtype, axis):
    dim = dim_arg(name, dim, axis)[0]
    if dim is None:
        dim = _softmax_dim(name, input.ndim, stacklevel + 1)
    if dtype is not None:
        input = cast(input, dtype)
    return cls.apply(input, axis=normalize_axes(dim, input.ndim)[0])


def softmax(input, dim=None, _stacklevel=3, dtype=None, *, axis=None):  # noqa: A002
    """exp(x) / sum(exp(x)) along ``dim``; no dim: PyTorch's implicit choice
    (0 for 0-, 1- and 3-D input, else 1) with its warning."""
    return _softmax(Softmax, "softmax", input, dim, _stacklevel, dtype, axis)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None, *, axis=None):  # noqa: A002
    return _softmax(LogSoftmax, "log_softmax", input, dim, _stacklevel, dtype, axis)


def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002
    """Zero elements with probability p and scale the rest by 1/(1-p)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:  # every element dropped; the 1/(1-p) scale would divide by zero
        return input * 0.0
    if is_meta_array(input.array):  # shape-only: PyTorch's meta dropout draws nothing
        return input * 1.0
    return Dropout.apply(input, p=p)


def _check_p(p):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _keep_mask(like, shape, keep):
    """Bernoulli(keep) draws of ``shape`` in ``like``'s dtype, from the
    generator PyTorch's ``bernoulli_(keep)`` reads (float64 uniforms)."""
    xp, dtype = xp_of(like), like.dtype
    if is_meta_array(like):  # shape-only: drawing nothing, as PyTorch's meta dropout
        return meta_array(shape, dtype)
    if xp is np:
        return distributions.bernoulli_scalar(generator_for(np), shape, keep, dtype)
    return (generator_for(xp).random(shape, dtype=np.float64) < keep).astype(dtype)


def _noise_dropout(input, p, feature, alpha):  # noqa: A002 - PyTorch's name
    """PyTorch's dropout family: a mask per element, or per channel
    (``feature``: shape (N, C, 1, ...)), scaled by 1/(1-p); ``alpha``: the
    SELU-preserving form, dropped values set to -alpha' and an affine map
    keeping mean and variance (alpha' = 1.7580993408473766)."""
    if p == 1.0:
        return input * 0.0
    if feature and input.ndim < 2:
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    shape = tuple(input.shape[:2]) + (1,) * (input.ndim - 2) if feature else input.shape
    noise = _keep_mask(input.array, shape, 1.0 - p)
    if not alpha:
        return input * Tensor(noise / noise.dtype.type(1.0 - p))
    alpha_ = 1.7580993408473766
    a = 1.0 / math.sqrt((alpha_ * alpha_ * p + 1) * (1 - p))
    b = (noise - 1) * (alpha_ * a) + alpha_ * a * p
    return input * Tensor(noise * noise.dtype.type(a)) + Tensor(b.astype(noise.dtype))


def _channel_dropout(name, input, p, training, spatial):  # noqa: A002 - PyTorch's name
    """dropout1d/2d/3d: (N, C, *spatial) or unbatched (C, *spatial) input."""
    _check_p(p)
    ndim, batched = input.ndim, input.ndim == spatial + 2
    if name == "dropout1d" and ndim not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {ndim}D "
                           "input. Note that dropout1d exists to provide channel-wise dropout "
                           "on inputs with 1 spatial dimension, a channel dimension, and an "
                           "optional batch dimension (i.e. 2D or 3D inputs).")
    if name != "dropout1d" and ndim not in (spatial + 1, spatial + 2):
        warnings.warn(f"{name}: Received a {ndim}-D input to {name}, which is deprecated and "
                      "will result in an error in a future release. To retain the behavior "
                      f"and silence this warning, please use dropout instead. Note that {name} "
                      f"exists to provide channel-wise dropout on inputs with {spatial} spatial "
                      "dimensions, a channel dimension, and an optional batch dimension (i.e. "
                      f"{spatial + 1}D or {spatial + 2}D inputs).", stacklevel=3)
        batched = True
    elif name == "dropout2d" and ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that "
                      "channel-wise 1D dropout behavior is desired - input is interpreted as "
                      "shape (N, C, L), where C is the channel dim. This behavior will change "
                      "in a future release to interpret the input as one without a batch "
                      "dimension, i.e. shape (C, H, W). To maintain the 1D channel-wise "
                      "dropout behavior, please switch to using dropout1d instead.",
                      stacklevel=3)
        batched = True
    if not training or p == 0.0:
        return input
    x = input if batched else input.unsqueeze(0)
    out = _noise_dropout(x, p, feature=True, alpha=False)
    return out if batched else out.squeeze(0)


def dropout1d(input, p=0.5, training=True, inplace=False):  # noqa: A002
    """Zero whole channels of (N, C, L) or (C, L) input with probability p."""
    return _channel_dropout("dropout1d", input, p, training, 1)


def dropout2d(input, p=0.5, training=True, inplace=False):  # noqa: A002
    """Zero whole channels of (N, C, H, W) or (C, H, W) input with probability p
    (a 3-D input is taken as (N, C, L), with PyTorch's warning)."""
    return _channel_dropout("dropout2d", input, p, training, 2)


def dropout3d(input, p=0.5, training=True, inplace=False):  # noqa: A002
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W) input with probability p."""
    return _channel_dropout("dropout3d", input, p, training, 3)


def alpha_dropout(input, p=0.5, training=False, inplace=False):  # noqa: A002
    """Dropout for SELU networks: keeps the input's mean and variance."""
    _check_p(p)
    return input if not training or p == 0.0 else _noise_dropout(input, p, False, True)


def feature_alpha_dropout(input, p=0.5, training=False, inplace=False):  # noqa: A002
    """``alpha_dropout`` of whole channels."""
    _check_p(p)
    return input if not training or p == 0.0 else _noise_dropout(input, p, True, True)


def _layer_norm_last(x, weight, bias, eps):
    """Over the last dim; the op takes both of weight and bias or neither."""
    if weight is None and bias is None:
        return LayerNorm.apply(x, eps=eps)
    like = weight if weight is not None else bias
    xp = xp_of(like.array)
    weight = weight if weight is not None else Tensor(xp.ones_like(like.array))
    bias = bias if bias is not None else Tensor(xp.zeros_like(like.array))
    return LayerNorm.apply(x, weight, bias, eps=eps)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):  # noqa: A002
    """Normalise over the trailing dims ``normalized_shape`` (an int or a
    tuple), then scale and shift by ``weight`` and ``bias`` of that shape."""
    if not isinstance(normalized_shape, (int, tuple, list)):
        raise TypeError("layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5): "
                        f"normalized_shape must be an int or a tuple, got "
                        f"{type(normalized_shape).__name__}")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if not 0 < k <= input.ndim or tuple(input.shape[input.ndim - k:]) != shape:
        raise RuntimeError(f"layer_norm: given normalized_shape={list(shape)}, expected input "
                           f"with shape [*, {', '.join(map(str, shape))}], but got input of "
                           f"size {list(input.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise RuntimeError(f"layer_norm: {name} has shape {tuple(t.shape)}, expected "
                               f"normalized_shape {shape}")
    if k == 1:
        return _layer_norm_last(input, weight, bias, eps)
    flat = [None if t is None else t.reshape(-1) for t in (weight, bias)]
    out = _layer_norm_last(input.reshape(tuple(input.shape[:-k]) + (-1,)), *flat, eps)
    return out.reshape(input.shape)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,  # noqa: A002
              scale_grad_by_freq=False, sparse=False):
    """Rows of ``weight`` (num, dim) selected by integer ``input``; the row
    ``padding_idx`` receives no gradient. ``sparse=True`` gives the same
    values as a dense gradient; max_norm and scale_grad_by_freq raise."""
    if max_norm is not None or scale_grad_by_freq:
        raise NotImplementedError("embedding: max_norm and scale_grad_by_freq are not "
                                  "supported")
    idx = input.array if isinstance(input, Tensor) else xp_of(weight.array).asarray(input)
    num = weight.shape[0]
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got dtype {idx.dtype}")
    if idx.size and not is_meta_array(idx) and (int(idx.min()) < 0 or int(idx.max()) >= num):
        raise IndexError(f"embedding: index out of range [0, {num}): "
                         f"min {int(idx.min())}, max {int(idx.max())}")
    if padding_idx is not None:
        if not -num <= padding_idx < num:
            raise ValueError(f"embedding: padding_idx {padding_idx} must be within "
                             f"num_embeddings {num}")
        padding_idx %= num
    return Embedding.apply(weight, indices=idx, padding_idx=padding_idx)


# -- tensors ----------------------------------------------------------------------------------
def one_hot(tensor, num_classes=-1):
    """int64 tensor of shape ``tensor.shape + (num_classes,)``; -1: max + 1."""
    idx = tensor.array if isinstance(tensor, Tensor) else xp_of().asarray(tensor)
    xp = xp_of(idx)
    if idx.dtype.kind not in "iu":
        raise RuntimeError(f"one_hot is only applicable to index tensor, got dtype {idx.dtype}")
    checked = idx.size and not is_meta_array(idx)  # a meta tensor's values are unknown
    if checked and int(idx.min()) < 0:
        raise RuntimeError("one_hot: Class values must be non-negative.")
    if num_classes == -1:
        if not idx.size:
            raise RuntimeError("one_hot: Can not infer total number of classes from empty "
                               "tensor.")
        num_classes = int(idx.max()) + 1
    elif checked and int(idx.max()) >= num_classes:
        raise RuntimeError(f"one_hot: Class values must be smaller than num_classes "
                           f"({num_classes}), got {int(idx.max())}.")
    return Tensor((idx[..., None] == xp.arange(num_classes)).astype(xp.int64))


def pad(input, pad, mode="constant", value=None):  # noqa: A002
    """Pad the last dims: ``pad`` = (left, right) of the last dim, then of the
    one before, and so on (PyTorch's order: last dim first). A negative amount
    crops in "constant" mode; "reflect" mirrors without repeating the edge,
    "replicate" repeats the edge, "circular" wraps around."""
    if len(pad) % 2:
        raise RuntimeError(f"pad: padding length must be divisible by 2, got {len(pad)}")
    if len(pad) // 2 > input.ndim:
        raise RuntimeError(f"pad: padding length {len(pad)} is too large for a "
                           f"{input.ndim}-D input")
    if mode not in PAD_MODES:
        raise NotImplementedError(f"pad: mode must be one of {PAD_MODES}, got {mode!r}")
    widths = [(0, 0)] * input.ndim
    for k in range(len(pad) // 2):
        widths[input.ndim - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    for n, (b, a) in zip(input.shape, widths):
        if n + b + a < 0 or (mode != "constant" and min(b, a) < 0):
            raise RuntimeError(f"pad: padding {tuple(pad)} gives a negative size for "
                               f"input {tuple(input.shape)} (mode {mode!r})")
        limit = n if mode == "circular" else n - 1
        if mode in ("reflect", "circular") and max(b, a) > limit:
            raise RuntimeError(f"pad: {mode} padding {tuple(pad)} must be at most {limit} "
                               f"for a dim of size {n} (input {tuple(input.shape)})")
    if value is not None and mode != "constant":
        raise RuntimeError(f"pad: padding mode {mode!r} doesn't take in value argument")
    return Pad.apply(input, widths=tuple(widths), mode=mode,
                     value=0.0 if value is None else value)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):  # noqa: A002
    """input / max(‖input‖_p, eps) along ``dim``."""
    if out is not None:
        raise NotImplementedError("normalize: out= is not supported; use the result")
    return Normalize.apply(input, p=p, dim=dim, eps=eps)
