"""Loss modules (``torch.nn.CrossEntropyLoss`` and friends): PyTorch's
classes and constructor arguments over the functional losses.

Each module keeps its arguments and calls ``F.<loss>`` in ``forward``. Class
weights and ``pos_weight`` are registered buffers, as in PyTorch, so they
appear in ``state_dict()`` (keys ``weight``, ``pos_weight``) and move with
``to()``. The reduction is checked when the module is built (PyTorch checks
it at the first call): a typo fails where it was written.
"""
from .. import functional as F
from ...ops.losses import reduction_of
from .module import Module

__all__ = ["CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss",
           "BCELoss", "BCEWithLogitsLoss", "KLDivLoss"]


class _Loss(Module):
    """Holds ``reduction``; PyTorch's deprecated ``size_average``/``reduce``
    map onto it once, here, with PyTorch's warning."""

    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        self.reduction = reduction_of(type(self).__name__, reduction, size_average, reduce)


class _WeightedLoss(_Loss):
    """A loss with an optional ``weight``, registered as a buffer (None when
    absent, so no ``weight`` key is saved, as PyTorch)."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)


class CrossEntropyLoss(_WeightedLoss):
    """``F.cross_entropy(input, target, weight, ignore_index=...,
    reduction=..., label_smoothing=...)``: logits against class indices or
    class probabilities."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean", label_smoothing=0.0):
        super().__init__(weight, size_average, reduce, reduction)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], "
                             f"got {label_smoothing}")
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, input, target):  # noqa: A002 - PyTorch's names
        return F.cross_entropy(input, target, weight=self.weight,
                               ignore_index=self.ignore_index, reduction=self.reduction,
                               label_smoothing=self.label_smoothing)


class NLLLoss(_WeightedLoss):
    """``F.nll_loss``: log-probabilities against class indices."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean"):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input, target):  # noqa: A002
        return F.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index,
                          reduction=self.reduction)


class MSELoss(_Loss):
    """``F.mse_loss``: mean (or sum, or each) of the squared differences."""

    def forward(self, input, target):  # noqa: A002
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    """``F.l1_loss``: the absolute differences."""

    def forward(self, input, target):  # noqa: A002
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """``F.smooth_l1_loss`` with ``beta``: quadratic below beta, linear above."""

    def __init__(self, size_average=None, reduce=None, reduction="mean", beta=1.0):
        super().__init__(size_average, reduce, reduction)
        if beta < 0:
            raise ValueError(f"SmoothL1Loss: beta must be non-negative, got {beta}")
        self.beta = beta

    def forward(self, input, target):  # noqa: A002
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """``F.huber_loss`` with ``delta``: smooth l1 with beta = delta, times delta."""

    def __init__(self, reduction="mean", delta=1.0):
        super().__init__(reduction=reduction)
        if not delta > 0:
            raise ValueError(f"HuberLoss: delta must be positive, got {delta}")
        self.delta = delta

    def forward(self, input, target):  # noqa: A002
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class BCELoss(_WeightedLoss):
    """``F.binary_cross_entropy`` on probabilities, ``weight`` per element
    (broadcasting)."""

    def forward(self, input, target):  # noqa: A002
        return F.binary_cross_entropy(input, target, weight=self.weight,
                                      reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    """``F.binary_cross_entropy_with_logits``; ``weight`` and ``pos_weight``
    are buffers (state_dict keys ``weight``, ``pos_weight``)."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean",
                 pos_weight=None):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input, target):  # noqa: A002
        return F.binary_cross_entropy_with_logits(input, target, weight=self.weight,
                                                  reduction=self.reduction,
                                                  pos_weight=self.pos_weight)


class KLDivLoss(_Loss):
    """``F.kl_div``: input log-probabilities, target probabilities (or
    log-probabilities with ``log_target=True``); ``reduction="batchmean"``
    gives the KL divergence per sample."""

    def __init__(self, size_average=None, reduce=None, reduction="mean", log_target=False):
        if reduction == "batchmean" and size_average is None and reduce is None:
            super().__init__(reduction="sum")  # checks nothing more; replaced just below
            self.reduction = "batchmean"
        else:
            super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input, target):  # noqa: A002
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)
