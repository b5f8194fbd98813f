"""Optimizers, gradient clipping and learning-rate schedules.

PyTorch's names and update rules, on raw NumPy/CuPy arrays updated in place.
"""
from . import lr_scheduler
from .adam import Adam, AdamW
from .adam_variants import NAdam, RAdam
from .adaptive import Adadelta, Adagrad, RMSprop
from .lbfgs import LBFGS
from ..nn.utils.clip_grad import clip_grad_norm_, clip_grad_value_
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "clip_grad_norm_", "clip_grad_value_",
           "lr_scheduler", "Adagrad", "Adadelta", "RMSprop", "NAdam", "RAdam", "LBFGS"]
