"""Softmax cross-entropy over logits (N, C) and integer labels (N,),
forward and backward, each one pass over the logits.

Forward keeps the softmax (N, C), as the reference keeps log-probabilities;
backward is then ``(softmax - onehot) * scale`` in one pass. The plain-xp
reference is ``spmdnet.ops.losses.CrossEntropy``.

The op uses these kernels for small logits only (dispatch.py's table,
``CROSS_ENTROPY_MAX_SIZE``).
"""
import math

import numpy as np

from ..backend import xp_of
from . import reduce, softmax, special
from ._cpu import CpuKernel
from ._numba import prange
from ._target import check_target

def _forward(x, labels, losses, probs, c):
    """probs[i] = softmax(x[i]); losses[i] = log(s) - (x[i, labels[i]] - m)
    with m = max(x[i]) and s = sum(exp(x[i] - m))."""
    zero, one, neg_inf = c[0], c[1], c[2]
    for i in range(x.shape[0]):
        m = reduce.row_max(x, i, neg_inf)
        for j in range(x.shape[1]):
            probs[i, j] = special.exp(x[i, j] - m)
        s = reduce.row_sum(probs, i, zero)
        inv = one / s
        for j in range(x.shape[1]):
            probs[i, j] *= inv
        losses[i] = math.log(s) - (x[i, labels[i]] - m)


def _backward(probs, labels, scale, grad, c):
    """grad[i] = (probs[i] - onehot(labels[i])) * scale[i]."""
    one = c[1]
    for i in prange(probs.shape[0]):
        s = scale[i]
        for j in range(probs.shape[1]):
            grad[i, j] = probs[i, j] * s
        k = labels[i]
        grad[i, k] = (probs[i, k] - one) * s


_cpu = {"forward": CpuKernel(_forward), "backward": CpuKernel(_backward)}


def _check_labels(logits, labels):
    n, classes = logits.shape
    if labels.shape != (n,) or labels.dtype.kind not in "iu" or (
            isinstance(logits, np.ndarray) != isinstance(labels, np.ndarray)):
        raise TypeError(f"cross-entropy kernels: labels must be integers of shape ({n},) "
                        f"and the logits' array kind, got {type(labels).__name__} "
                        f"{labels.shape} of {labels.dtype}")
    if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise ValueError(f"cross-entropy kernels: labels out of range [0, {classes})")


def forward(logits, labels, check=True):
    """``(losses, probs)``: the per-row losses (N,) and the softmax (N, C),
    which ``backward`` needs. ``check=False`` skips the labels' range check
    (for callers that made it already: an index out of range is undefined)."""
    check_target("cross-entropy", logits)
    if logits.ndim != 2:
        raise ValueError(f"cross-entropy kernels: logits must be (N, C), got {logits.shape}")
    n, classes = logits.shape
    if check:
        _check_labels(logits, labels)
    xp = xp_of(logits)
    losses, probs = xp.empty(n, logits.dtype), xp.empty(logits.shape, logits.dtype)
    if logits.size == 0:
        if n:
            raise ValueError("cross-entropy kernels: logits with 0 classes")
        return losses, probs
    x = logits if logits.flags.c_contiguous else xp.ascontiguousarray(logits)
    _cpu["forward"](x, labels, losses, probs, softmax.constants(x.dtype))
    return losses, probs


def backward(probs, labels, scale):
    """d(sum_i scale[i] * loss_i)/d logits = (probs - onehot) * scale[:, None],
    from ``forward``'s probs (labels as given to forward: not checked again)."""
    check_target("cross-entropy", probs, scale)
    if probs.ndim != 2 or scale.shape != probs.shape[:1] or labels.shape != scale.shape:
        raise ValueError(f"cross-entropy kernels: probs {probs.shape}, labels "
                         f"{labels.shape}, scale {scale.shape} do not fit")
    xp = xp_of(probs)
    grad = xp.empty(probs.shape, probs.dtype)
    if grad.size == 0:
        return grad
    scale = scale if scale.flags.c_contiguous else xp.ascontiguousarray(scale)
    _cpu["backward"](probs, labels, scale, grad, softmax.constants(probs.dtype))
    return grad


def warmup(dtype):
    """Compile the CPU kernels for ``dtype`` (int64 labels)."""
    x, labels = np.zeros((2, 3), dtype), np.zeros(2, np.int64)
    losses, probs = forward(x, labels)
    backward(probs, labels, losses)
