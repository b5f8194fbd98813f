"""Modules and layers (``spmdnet.nn``), PyTorch's names and state_dict keys."""
from . import init
from .containers import ModuleList, ModuleSequence, Sequential
from .layers import GELU, Dropout, Embedding, Identity, LayerNorm, Linear, ReLU, Sigmoid, Tanh
from .module import Module
from .parameter import Parameter

__all__ = ["Module", "Parameter", "Linear", "Sequential", "ModuleList", "ReLU", "GELU",
           "Tanh", "Sigmoid", "Identity", "Dropout", "LayerNorm", "Embedding", "init",
           "ModuleSequence"]
