"""huber_loss and kl_div, with PyTorch's arguments: the two functional losses
the loss modules (nn/modules/loss.py) need that ops/pointwise_losses.py lacks.

Both are element-by-element losses of (input, target), so they reuse that
file's ``_Pointwise`` op (reduction, weight, broadcasting, gradients of both
operands) and define only the per-element loss and its two derivatives.
"""
import warnings

import numpy as np

from .._tensor import Tensor
from ..backend import xp_of
from .losses import reduction_of
from .pointwise_losses import _apply, _operands, _Pointwise


class HuberLoss(_Pointwise):
    """0.5·d² where |d| < δ, else δ·(|d| - 0.5·δ): smooth l1 with β = δ,
    times δ (so its slope far from 0 is δ, not 1)."""

    def loss(self, a, b, delta=1.0):
        xp = xp_of(a, b)
        d = xp.abs(a - b)
        return xp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))

    def grads(self, a, b, delta=1.0):
        xp = xp_of(a, b)
        d = a - b
        ga = xp.where(xp.abs(d) < delta, d, delta * xp.sign(d))
        return ga, -ga


class KLDivLoss(_Pointwise):
    """Pointwise KL divergence of log-probabilities x from a target y:
    y·(log y - x), 0 where y = 0 (``log_target=False``); exp(y)·(y - x) for a
    target given as log-probabilities (``log_target=True``)."""

    def loss(self, x, y, log_target=False):
        xp = xp_of(x, y)
        if log_target:
            return xp.exp(y) * (y - x)
        positive = y > 0
        with np.errstate(divide="ignore", invalid="ignore"):  # log(0): masked out
            log_y = xp.log(xp.where(positive, y, 1))
        return xp.where(positive, y * (log_y - x), 0 * x)

    def grads(self, x, y, log_target=False):
        xp = xp_of(x, y)
        if log_target:
            e = xp.exp(y)
            return -e, e * (y - x + 1)
        positive = y > 0
        log_y = xp.log(xp.where(positive, y, 1))
        return -y, xp.where(positive, log_y + 1 - x, 0 * x)


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """PyTorch's F.huber_loss; ``delta`` must be positive (PyTorch raises too)."""
    reduction = reduction_of("huber_loss", reduction)
    if not delta > 0:
        raise ValueError(f"huber_loss: delta must be positive, got {delta}")
    target, weight = _operands("huber_loss", input, target, weight)
    return _apply(HuberLoss, input, target, weight, reduction, delta=float(delta))


def _kl_target(input, target):
    """``target`` as a tensor of the input's dtype that broadcasts against it
    (kl_div broadcasts without the other losses' size warning, as PyTorch)."""
    if not isinstance(target, Tensor):
        target = Tensor(xp_of(input.array).asarray(target, dtype=input.dtype))
    try:
        np.broadcast_shapes(input.shape, target.shape)
    except ValueError:
        raise ValueError(f"kl_div: input {input.shape} and target {target.shape} cannot be "
                         "broadcast together") from None
    return target


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """PyTorch's F.kl_div: ``input`` holds log-probabilities; "batchmean"
    divides the sum by the batch size (input.shape[0]), the KL divergence's
    definition; "mean" divides by every element and warns, as PyTorch."""
    if reduction == "batchmean" and size_average is None and reduce is None:
        target = _kl_target(input, target)
        total = _apply(KLDivLoss, input, target, None, "sum", log_target=bool(log_target))
        return total / (input.shape[0] if input.ndim else 1)
    reduction = reduction_of("kl_div", reduction, size_average, reduce)
    if reduction == "mean":
        warnings.warn("kl_div: reduction 'mean' divides the total loss by both the batch size "
                      "and the support size; 'batchmean' divides only by the batch size, as "
                      "the KL divergence is defined.", UserWarning, stacklevel=2)
    target = _kl_target(input, target)
    return _apply(KLDivLoss, input, target, None, reduction, log_target=bool(log_target))
