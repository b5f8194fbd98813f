"""Optimizers, gradient clipping and learning-rate schedules.

PyTorch's names and update rules, on raw NumPy/CuPy arrays updated in place.
"""
from . import lr_scheduler
from .adam import Adam, AdamW
from .clip import clip_grad_norm_
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "clip_grad_norm_", "lr_scheduler"]
