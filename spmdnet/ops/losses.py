"""Class-index losses: cross_entropy (against class indices or class
probabilities) and nll_loss, with PyTorch's arguments; the reductions shared
by every loss.

Reductions follow PyTorch: "mean" divides by the number of losses, except
against class indices, where it divides by the summed ``weight`` of the
targets that are not ``ignore_index`` (their count without a weight). Logits
(N, C, d1, ...) are viewed as rows (N·d1·..., C), the class dim last, and
gradients are viewed back.

cross_entropy over (N, C) logits with no weight, no ignored target and no
label smoothing runs the kernels where ``kernels.lookup`` gives them (the MLP
training step); the xp code here is their reference.
"""
import warnings
import numpy as np

from .. import kernels
from .._tensor import Tensor
from ..autograd import Function
from ..backend import xp_of
from .nn_ops import _log_softmax

REDUCTIONS = ("mean", "sum", "none")


def reduction_of(name, reduction, size_average=None, reduce=None):
    """The reduction, checked; PyTorch's deprecated ``size_average`` and
    ``reduce`` map onto it as PyTorch maps them (with its warning)."""
    if size_average is not None or reduce is not None:
        warnings.warn("size_average and reduce args will be deprecated, please use "
                      "reduction= instead.", UserWarning, stacklevel=3)
        size_average = True if size_average is None else size_average
        reduction = "none" if reduce is False else "mean" if size_average else "sum"
    if reduction not in REDUCTIONS:
        raise ValueError(f"{name}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return reduction


def reduce_losses(losses, reduction, count):
    """Sum, mean over ``count`` (a number or a 0-d array), or the losses. The
    mean of no losses (an empty batch, every target ignored) is NaN, silently,
    as PyTorch's: 0/0 without NumPy's RuntimeWarning."""
    if reduction == "none":
        return losses
    total = losses.sum()
    if reduction != "mean":
        return total
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / count


def loss_scale(g, reduction, count, shape):
    """d(reduced loss)/d(each loss): an array of ``shape``, or a scalar."""
    if reduction == "none":
        return g.reshape(shape)
    if reduction != "mean":
        return g
    # no counted losses (every target ignored): PyTorch's gradient is 0, not
    # NaN; dividing by 1 there leaves every loss's own zero weight to give it
    return g / (count + (count == 0))


def _rows(x):
    """(C,) -> (1, C); (N, C, d1, ...) -> (N·d1·..., C), the class dim last."""
    if x.ndim == 1:
        return x.reshape(1, -1)
    return xp_of(x).moveaxis(x, 1, -1).reshape(-1, x.shape[1])


def _unrows(g, shape):
    """The inverse of ``_rows`` for an array of the logits' ``shape``."""
    if len(shape) <= 2:
        return g.reshape(shape)
    moved = (shape[0],) + tuple(shape[2:]) + (shape[1],)
    return xp_of(g).moveaxis(g.reshape(moved), -1, 1)


class _ClassIndexLoss(Function):
    def targets(self, labels, weight, ignore_index, dtype):
        """Keep the rows' targets (ignored ones replaced by 0, a valid index),
        their weights ``weight[target]`` (0 where ignored), the kept-row mask
        (None: all kept) and the mean's denominator."""
        xp = xp_of(labels)
        target = labels.reshape(-1)
        self.keep = None if ignore_index is None else (target != ignore_index).astype(dtype)
        if self.keep is not None:
            target = xp.where(self.keep > 0, target, 0)
        wy = xp.ones(target.shape, dtype) if weight is None else weight[target]
        self.labels, self.wy = target, (wy if self.keep is None else wy * self.keep)
        plain = weight is None and ignore_index is None
        self.count = self.wy.shape[0] if plain else self.wy.sum()


class CrossEntropy(_ClassIndexLoss):
    """Fused log_softmax + negative log likelihood: logits (N, C) or
    (N, C, d1, ...), integer labels (N,) or (N, d1, ...). ``weight`` (C,) weighs
    the classes, labels equal to ``ignore_index`` count zero, and
    ``label_smoothing`` ε mixes the one-hot target with the uniform one:
    l = (1-ε)·w_y·(-logp_y) + ε/C·Σ_c w_c·(-logp_c)."""

    def forward(self, logits, labels, reduction="mean", weight=None, ignore_index=None,
                label_smoothing=0.0):
        self.shape, self.reduction, self.eps = logits.shape, reduction, label_smoothing
        kernel = self.backward_kernel = None
        if weight is None and ignore_index is None and not label_smoothing and logits.ndim == 2:
            kernel = kernels.lookup("cross_entropy", logits)
            self.backward_kernel = kernels.lookup("cross_entropy", logits, step="backward")
        if kernel is not None:  # keeps the softmax (N, C) for backward
            self.labels, self.count = labels, labels.shape[0]
            losses, self.probs = kernel(logits, labels)
            return reduce_losses(losses, reduction, self.count)
        x = _rows(logits)
        self.targets(labels, weight, ignore_index, x.dtype)
        self.logp = _log_softmax(x, axis=1)
        losses = -self.logp[xp_of(x).arange(x.shape[0]), self.labels] * self.wy
        if label_smoothing:
            self.weight = weight
            smooth = (self.logp if weight is None else self.logp * weight).sum(axis=1)
            kept = 1 if self.keep is None else self.keep
            losses = (1 - label_smoothing) * losses - (label_smoothing / x.shape[1]) * kept * smooth
        return reduce_losses(losses.reshape(labels.shape), reduction, self.count)

    def backward(self, g):
        xp = xp_of(g)
        n = self.labels.shape[0]
        scale = loss_scale(g, self.reduction, self.count, (n,))
        if self.backward_kernel is not None:
            scale = xp.full(n, scale, dtype=self.probs.dtype) if self.reduction != "none" \
                else scale.astype(self.probs.dtype, copy=False)
            return self.backward_kernel(self.probs, self.labels, scale), None
        grad = xp.exp(self.logp)  # softmax
        target = scale * self.wy * (1 - self.eps)
        if self.eps:  # d/dx of ε/C·Σ_c w_c·(-logp_c) is ε/C·(softmax·Σ_c w_c - w)
            kept = xp.ones(n, grad.dtype) if self.keep is None else self.keep
            smooth = scale * (self.eps / grad.shape[1]) * kept
            total = grad.shape[1] if self.weight is None else self.weight.sum()
            grad *= (target + smooth * total)[:, None]
            grad -= smooth[:, None] * (1 if self.weight is None else self.weight)
        else:
            grad *= target[:, None]
        grad[xp.arange(n), self.labels] -= target
        return _unrows(grad, self.shape), None


class CrossEntropyProbs(Function):
    """Cross-entropy against class probabilities of the logits' shape:
    l = -Σ_c w_c·q_c·logp_c with q = (1-ε)·target + ε/C; "mean" divides by the
    number of rows (the elements of one class)."""

    def forward(self, logits, target, reduction="mean", weight=None, label_smoothing=0.0):
        self.shape, self.reduction, self.eps = logits.shape, reduction, label_smoothing
        x, q = _rows(logits), _rows(target)
        if label_smoothing:
            q = q * (1 - label_smoothing) + label_smoothing / x.shape[1]
        self.weight = weight
        self.q = q if weight is None else q * weight
        self.logp = _log_softmax(x, axis=1)
        self.count = x.shape[0] if x.shape[0] else float("nan")
        losses = -(self.q * self.logp).sum(axis=1)
        return reduce_losses(losses.reshape(self.shape[:1] + self.shape[2:]) if len(self.shape) > 1
                             else losses.reshape(()), reduction, self.count)

    def backward(self, g):
        xp = xp_of(g)
        n = self.logp.shape[0]
        scale = loss_scale(g, self.reduction, self.count, (n,))
        scale = scale[:, None] if xp.ndim(scale) else scale
        need_x, need_t = self.needs_input_grad
        gx = gt = None
        if need_x:
            gx = (xp.exp(self.logp) * self.q.sum(axis=1, keepdims=True) - self.q) * scale
            gx = _unrows(gx, self.shape)
        if need_t:
            gt = self.logp * (-(1 - self.eps) * scale)
            gt = _unrows(gt if self.weight is None else gt * self.weight, self.shape)
        return gx, gt


class NLLLoss(_ClassIndexLoss):
    """Negative log likelihood of log-probabilities (N, C) or (N, C, d1, ...):
    l = -w_y·input_y, zero where the label is ``ignore_index``."""

    def forward(self, logp, labels, reduction="mean", weight=None, ignore_index=None):
        self.shape, self.dtype, self.reduction = logp.shape, logp.dtype, reduction
        x = _rows(logp)
        self.targets(labels, weight, ignore_index, x.dtype)
        losses = -x[xp_of(x).arange(x.shape[0]), self.labels] * self.wy
        return reduce_losses(losses.reshape(labels.shape), reduction, self.count)

    def backward(self, g):
        xp = xp_of(g)
        n = self.labels.shape[0]
        grad = xp.zeros((n, self.shape[1] if len(self.shape) > 1 else self.shape[0]), self.dtype)
        grad[xp.arange(n), self.labels] = \
            -loss_scale(g, self.reduction, self.count, (n,)) * self.wy
        return _unrows(grad, self.shape), None


# -- the wrappers: PyTorch's signatures, arguments checked ----------------------------------
def _class_targets(name, input, target, ignore_index):
    """``target`` as an integer array fitting ``input``'s rows, checked, and
    the ``ignore_index`` the op needs (None when no target can be ignored)."""
    xp = xp_of(input.array)
    labels = xp.asarray(target.array if isinstance(target, Tensor) else target)
    want = () if input.ndim == 1 else input.shape[:1] + input.shape[2:]
    if input.ndim == 0 or labels.shape != want:
        raise ValueError(f"{name}: expected input (N, C) or (N, C, d1, ...) and target "
                         f"(N,) or (N, d1, ...) with the same N and d's, got input "
                         f"{input.shape} and target {labels.shape}")
    if labels.dtype.kind not in "iu":
        raise TypeError(f"{name}: target must hold integer class indices (or, for "
                        f"cross_entropy, probabilities of the input's shape), got dtype "
                        f"{labels.dtype} and shape {labels.shape}")
    c = input.shape[1] if input.ndim > 1 else input.shape[0]
    low, high = (int(labels.min()), int(labels.max())) if labels.size else (0, 0)
    if 0 <= low and high < c:  # every target a class: none ignored unless a class is
        return labels, (ignore_index if 0 <= ignore_index < c else None)
    bad = labels[(labels != ignore_index) & ((labels < 0) | (labels >= c))]
    if bad.size:
        raise IndexError(f"{name}: target {int(bad[0])} is out of bounds [0, {c}) "
                         f"(and is not ignore_index {ignore_index})")
    return labels, ignore_index


def _class_weight(name, weight, input):
    if weight is None:
        return None
    w = weight.array if isinstance(weight, Tensor) else xp_of(input.array).asarray(weight)
    c = input.shape[1] if input.ndim > 1 else input.shape[0]
    if w.shape != (c,):
        raise ValueError(f"{name}: weight must have shape ({c},), one per class, got {w.shape}")
    return w.astype(input.dtype, copy=False)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
                  reduce=None, reduction="mean", label_smoothing=0.0):
    """PyTorch's F.cross_entropy: logits (N, C), (N, C, d1, ...) or (C,);
    target class indices (N,) / (N, d1, ...) / (), or class probabilities of
    the input's shape (a float target)."""
    reduction = reduction_of("cross_entropy", reduction, size_average, reduce)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], "
                         f"got {label_smoothing}")
    w = _class_weight("cross_entropy", weight, input)
    probs = target.array if isinstance(target, Tensor) else target
    if getattr(probs, "dtype", None) is not None and probs.dtype.kind == "f" \
            and probs.shape == input.shape:
        target = target if isinstance(target, Tensor) else Tensor(probs)
        return CrossEntropyProbs.apply(input, target, reduction=reduction, weight=w,
                                       label_smoothing=label_smoothing)
    labels, ignore = _class_targets("cross_entropy", input, target, ignore_index)
    return CrossEntropy.apply(input, Tensor(labels), reduction=reduction, weight=w,
                              ignore_index=ignore, label_smoothing=label_smoothing)


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    """PyTorch's F.nll_loss: log-probabilities (N, C), (N, C, d1, ...) or (C,)
    against class indices."""
    reduction = reduction_of("nll_loss", reduction, size_average, reduce)
    w = _class_weight("nll_loss", weight, input)
    labels, ignore = _class_targets("nll_loss", input, target, ignore_index)
    return NLLLoss.apply(input, Tensor(labels), reduction=reduction, weight=w,
                         ignore_index=ignore)
