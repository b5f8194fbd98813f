"""Modules and layers (``spmdnet.nn``), PyTorch's names and state_dict keys."""
from . import functional, init, utils
from .attention import MultiheadAttention
from .activation import ELU, GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, \
    Softplus, Tanh
from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .conv import Conv1d, Conv2d
from .containers import ModuleDict, ModuleList, ModuleSequence, ParameterList, Sequential
from .layers import Dropout, Embedding, Flatten, Identity, LayerNorm, Linear, Unflatten
from .module import Module
from .pooling import AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, MaxPool2d, Upsample
from .parameter import Parameter

__all__ = ["Module", "Parameter", "Linear", "Sequential", "ModuleList", "ModuleDict",
           "ParameterList", "ReLU", "GELU", "Tanh", "Sigmoid", "SiLU", "LeakyReLU", "ELU",
           "Softplus", "Softmax", "LogSoftmax", "Identity", "Flatten", "Unflatten", "Dropout",
           "LayerNorm", "Embedding", "functional", "init", "utils", "ModuleSequence",
           "Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d",
           "AdaptiveMaxPool2d", "Upsample", "MultiheadAttention",
           "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"]
