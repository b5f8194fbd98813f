"""Modules and layers (``spmdnet.nn``), PyTorch's names and state_dict keys."""
from . import functional, init, utils
from .activation import ELU, GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, \
    Softplus, Tanh
from .containers import ModuleDict, ModuleList, ModuleSequence, ParameterList, Sequential
from .layers import Dropout, Embedding, Flatten, Identity, LayerNorm, Linear, Unflatten
from .module import Module
from .parameter import Parameter

__all__ = ["Module", "Parameter", "Linear", "Sequential", "ModuleList", "ModuleDict",
           "ParameterList", "ReLU", "GELU", "Tanh", "Sigmoid", "SiLU", "LeakyReLU", "ELU",
           "Softplus", "Softmax", "LogSoftmax", "Identity", "Flatten", "Unflatten", "Dropout",
           "LayerNorm", "Embedding", "functional", "init", "utils", "ModuleSequence"]
