"""Element-by-element losses: mse, l1, smooth l1, binary cross-entropy on
probabilities and on logits, with PyTorch's arguments.

Each is a loss of (input, target) per element, optionally times a ``weight``
that broadcasts, then reduced ("mean" over the elements). Input and target of
different shapes broadcast after PyTorch's warning, as PyTorch does.
"""
import warnings

import numpy as np

from .._tensor import Tensor
from ..autograd import Function
from ..backend import xp_of
from ._util import unbroadcast
from .losses import loss_scale, reduce_losses, reduction_of


class _Pointwise(Function):
    """``loss(a, b)`` per element, times the optional weight, reduced;
    ``grads(a, b)`` are its derivatives in a and b."""

    def forward(self, a, b, *weight, reduction="mean", **options):
        self.a, self.b, self.w = a, b, (weight[0] if weight else None)
        self.reduction, self.options = reduction, options
        losses = self.loss(a, b, **options)
        if self.w is not None:
            losses = losses * self.w
        self.out_shape = losses.shape
        return reduce_losses(losses, reduction, losses.size)

    def backward(self, g):
        scale = loss_scale(g, self.reduction, max(1, int(np.prod(self.out_shape))),
                           self.out_shape)
        if self.w is not None:
            scale = scale * self.w
        grads = self.grads(self.a, self.b, **self.options)
        need = self.needs_input_grad
        out = tuple(unbroadcast(gi * scale, x.shape) if wanted else None
                    for gi, x, wanted in zip(grads, (self.a, self.b), need[:2]))
        return out + (None,) * (len(need) - 2)


class MSELoss(_Pointwise):
    def loss(self, a, b):
        d = a - b
        return d * d

    def grads(self, a, b):
        d = 2 * (a - b)
        return d, -d


class L1Loss(_Pointwise):
    def loss(self, a, b):
        return xp_of(a, b).abs(a - b)

    def grads(self, a, b):
        s = xp_of(a, b).sign(a - b)
        return s, -s


class SmoothL1Loss(_Pointwise):
    """0.5·d²/β where |d| < β, else |d| - 0.5·β; β = 0 is the l1 loss."""

    def loss(self, a, b, beta=1.0):
        xp = xp_of(a, b)
        d = xp.abs(a - b)
        return d if beta == 0 else xp.where(d < beta, (0.5 / beta) * d * d, d - 0.5 * beta)

    def grads(self, a, b, beta=1.0):
        xp = xp_of(a, b)
        d = a - b
        ga = xp.sign(d) if beta == 0 else xp.where(xp.abs(d) < beta, d / beta, xp.sign(d))
        return ga, -ga


def _clamped_logs(x):
    """log(x) and log(1-x), each clamped at -100 as PyTorch's BCE does."""
    xp = xp_of(x)
    with np.errstate(divide="ignore"):  # log(0) = -inf on purpose, then clamped
        return xp.maximum(xp.log(x), -100), xp.maximum(xp.log1p(-x), -100)


class BCELoss(_Pointwise):
    """-(y·log x + (1-y)·log(1-x)) on probabilities x; backward divides by
    max(x·(1-x), 1e-12), as PyTorch."""

    def loss(self, x, y):
        log_x, log_1mx = _clamped_logs(x)
        return -(y * log_x + (1 - y) * log_1mx)

    def grads(self, x, y):
        log_x, log_1mx = _clamped_logs(x)
        return (x - y) / xp_of(x).maximum(x * (1 - x), 1e-12), log_1mx - log_x


class BCEWithLogitsLoss(_Pointwise):
    """p·y·softplus(-x) + (1-y)·softplus(x) with p = pos_weight: the stable
    form of -(p·y·log σ(x) + (1-y)·log(1-σ(x)))."""

    def loss(self, x, y, pos_weight=None):
        xp = xp_of(x, y)
        p = 1 if pos_weight is None else pos_weight
        return p * y * xp.logaddexp(0, -x) + (1 - y) * xp.logaddexp(0, x)

    def grads(self, x, y, pos_weight=None):
        xp = xp_of(x, y)
        p = 1 if pos_weight is None else pos_weight
        sig = 0.5 * (1 + xp.tanh(0.5 * x))  # σ(x), never overflowing
        return p * y * (sig - 1) + (1 - y) * sig, p * xp.logaddexp(0, -x) - xp.logaddexp(0, x)


# -- the wrappers: PyTorch's signatures ---------------------------------------------------
def _operands(name, input, target, *weights):
    """target as a tensor, weights as arrays of the input's dtype (they get no
    gradient); PyTorch's warning when input and target shapes differ (they
    then broadcast)."""
    def tensor(x):
        if x is None or isinstance(x, Tensor):
            return x
        return Tensor(xp_of(input.array).asarray(x, dtype=input.dtype))

    def weight(w):
        w = tensor(w)
        return w if w is None or w.dtype == input.dtype else Tensor(w.array.astype(input.dtype))
    target = tensor(target)
    if target.shape != input.shape:
        warnings.warn(f"{name}: Using a target size ({target.shape}) that is different to the "
                      f"input size ({input.shape}). This will likely lead to incorrect results "
                      "due to broadcasting. Please ensure they have the same size.",
                      UserWarning, stacklevel=3)
    try:
        xp_of(*(x.array for x in (input, target, *weights) if isinstance(x, Tensor)))
        np.broadcast_shapes(input.shape, target.shape)
    except ValueError:
        raise ValueError(f"{name}: input {input.shape} and target {target.shape} cannot be "
                         "broadcast together") from None
    return (target,) + tuple(weight(w) for w in weights)


def _apply(cls, input, target, weight, reduction, **options):
    args = (input, target) if weight is None else (input, target, weight)
    return cls.apply(*args, reduction=reduction, **options)


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    reduction = reduction_of("mse_loss", reduction, size_average, reduce)
    return _apply(MSELoss, input, *_operands("mse_loss", input, target), None, reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    reduction = reduction_of("l1_loss", reduction, size_average, reduce)
    return _apply(L1Loss, input, *_operands("l1_loss", input, target), None, reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    reduction = reduction_of("smooth_l1_loss", reduction, size_average, reduce)
    if beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    return _apply(SmoothL1Loss, input, *_operands("smooth_l1_loss", input, target), None,
                  reduction, beta=beta)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    """On probabilities; input and target must have the same shape (PyTorch
    raises ValueError too)."""
    reduction = reduction_of("binary_cross_entropy", reduction, size_average, reduce)
    shape = target.shape if hasattr(target, "shape") else np.shape(target)
    if tuple(shape) != input.shape:
        raise ValueError(f"binary_cross_entropy: Using a target size ({tuple(shape)}) that is "
                         f"different to the input size ({input.shape}) is deprecated. Please "
                         "ensure they have the same size.")
    target, weight = _operands("binary_cross_entropy", input, target, weight)
    return _apply(BCELoss, input, target, weight, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None,
                                     reduce=None, reduction="mean", pos_weight=None):
    """On logits; ``pos_weight`` weighs the positive term, broadcasting
    against the input (one per class along the last dim)."""
    reduction = reduction_of("binary_cross_entropy_with_logits", reduction, size_average,
                             reduce)
    shape = target.shape if hasattr(target, "shape") else np.shape(target)
    if tuple(shape) != input.shape:
        raise ValueError(f"binary_cross_entropy_with_logits: Target size ({tuple(shape)}) must "
                         f"be the same as input size ({input.shape})")
    target, weight, pos = _operands("binary_cross_entropy_with_logits", input, target,
                                    weight, pos_weight)
    return _apply(BCEWithLogitsLoss, input, target, weight, reduction,
                  pos_weight=None if pos is None else pos.array)
