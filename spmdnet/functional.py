"""The functional API (``spmdnet.functional as F``), PyTorch's names.

Thin wrappers over the ops in ``spmdnet.ops``: they validate arguments and
turn Python values into tensors; the math lives in the ops.
"""
from .backend import xp_of
from .ops import (
    GELU,
    Concatenate,
    CrossEntropy,
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    LinearAct,
    LogSoftmax,
    MSELoss,
    Softmax,
    Stack,
    as_tensor_like,
    exp,
    log,
    matmul,
    relu,
    sigmoid,
    sqrt,
    tanh,
)
from ._tensor import Tensor

__all__ = ["linear", "relu", "tanh", "sigmoid", "gelu", "exp", "log", "sqrt", "matmul",
           "softmax", "log_softmax", "cross_entropy", "mse_loss", "dropout", "layer_norm",
           "embedding", "concatenate", "stack"]

_REDUCTIONS = ("mean", "sum", "none")


ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "tanh", "sigmoid")


def linear(x, weight, bias=None, activation=None):
    """x @ weight.T + bias, weight of shape (out_features, in_features).

    ``activation`` (one of ``ACTIVATIONS``; "gelu_tanh" is
    ``gelu(approximate="tanh")``) applies it in the same op: the same values
    as ``F.relu(F.linear(x, w, b))``, with one pass over the output instead of
    three (``nn.Sequential`` fuses Linear + activation this way)."""
    x = as_tensor_like(x, weight)
    args = (x, weight) if bias is None else (x, weight, bias)
    if activation is None:
        return Linear.apply(*args)
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be None or one of {ACTIVATIONS}, "
                         f"got {activation!r}")
    return LinearAct.apply(*args, activation=activation)


def gelu(x, approximate="none"):
    """x·Φ(x); ``approximate="tanh"`` uses the tanh formula."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return GELU.apply(x, approximate=approximate)


def softmax(x, axis=-1):
    return Softmax.apply(x, axis=axis)


def log_softmax(x, axis=-1):
    return LogSoftmax.apply(x, axis=axis)


def _check_reduction(reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def cross_entropy(logits, labels, reduction="mean"):
    """Softmax cross-entropy of logits (N, C) against integer labels (N,)."""
    _check_reduction(reduction)
    labels = labels.data if isinstance(labels, Tensor) else labels
    xp = xp_of(logits.data, labels)
    labels = xp.asarray(labels)
    if logits.ndim != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy: expected logits (N, C) and labels (N,), got "
                         f"{logits.shape} and {labels.shape}")
    if labels.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: labels must be integers, got dtype {labels.dtype}")
    if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= logits.shape[1]):
        bad = int(labels.min()) if int(labels.min()) < 0 else int(labels.max())
        raise ValueError(f"cross_entropy: label {bad} is out of range [0, {logits.shape[1]})")
    return CrossEntropy.apply(logits, Tensor(labels), reduction=reduction)


def mse_loss(a, b, reduction="mean"):
    """Mean (or sum, or elementwise) squared difference of equal shapes."""
    _check_reduction(reduction)
    b = as_tensor_like(b, a)
    if a.shape != b.shape:
        raise ValueError(f"mse_loss: shapes {a.shape} and {b.shape} differ")
    return MSELoss.apply(a, b, reduction=reduction)


def dropout(x, p=0.5, training=True):
    """Zero elements with probability p and scale the rest by 1/(1-p)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:  # every element dropped; the 1/(1-p) scale would divide by zero
        return x * 0.0
    return Dropout.apply(x, p=p)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Normalise over the last axis; optional elementwise weight and bias."""
    if weight is None and bias is None:
        return LayerNorm.apply(x, eps=eps)
    like = weight if weight is not None else bias
    xp = xp_of(like.data)
    weight = weight if weight is not None else Tensor(xp.ones_like(like.data))
    bias = bias if bias is not None else Tensor(xp.zeros_like(like.data))
    if weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
        raise ValueError(f"layer_norm: weight {weight.shape} and bias {bias.shape} must "
                         f"match the last axis of the input {x.shape}")
    return LayerNorm.apply(x, weight, bias, eps=eps)


def embedding(indices, weight):
    """Rows of ``weight`` (num, dim) selected by integer ``indices``."""
    idx = indices.data if isinstance(indices, Tensor) else xp_of(weight.data).asarray(indices)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got dtype {idx.dtype}")
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= weight.shape[0]):
        raise ValueError(f"embedding: index out of range [0, {weight.shape[0]}): "
                         f"min {int(idx.min())}, max {int(idx.max())}")
    return Embedding.apply(weight, indices=idx)


def concatenate(tensors, axis=0):
    return Concatenate.apply(*tensors, axis=axis)


def stack(tensors, axis=0):
    return Stack.apply(*tensors, axis=axis)
