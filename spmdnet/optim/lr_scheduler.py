"""Learning-rate schedules in PyTorch's shape (``torch.optim.lr_scheduler``).

The classes live by kind: the base class and the factor-of-the-epoch
schedules in ``scheduler.py``, cosine and one-cycle in
``cyclic_schedules.py``, SequentialLR and ReduceLROnPlateau in
``composite_schedules.py``. All but MultiplicativeLR and ReduceLROnPlateau
are closed forms of the epoch counter, so a resumed schedule gives the same
values bit for bit.
"""
from .composite_schedules import ReduceLROnPlateau, SequentialLR
from .cyclic_schedules import CosineAnnealingLR, CosineAnnealingWarmRestarts, OneCycleLR, \
    WarmupCosine
from .scheduler import ConstantLR, ExponentialLR, LambdaLR, LinearLR, LRScheduler, \
    MultiplicativeLR, MultiStepLR, PolynomialLR, StepLR

_LRScheduler = LRScheduler  # PyTorch's old name, still used by older model code

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR",
           "ConstantLR", "LinearLR", "ExponentialLR", "PolynomialLR", "CosineAnnealingLR",
           "CosineAnnealingWarmRestarts", "OneCycleLR", "WarmupCosine", "SequentialLR",
           "ReduceLROnPlateau"]
