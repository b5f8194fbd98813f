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


def __getattr__(name):
    """``nn.SyncBatchNorm`` (PyTorch's path): the layer reduces over MPI, so it
    lives with the strategies (``spmdnet.parallel.sync_batchnorm``, layer 8);
    it is imported at first use, nn (layer 5) never imports parallel at load."""
    if name == "SyncBatchNorm":
        from ..parallel.sync_batchnorm import SyncBatchNorm  # noqa: PLC0415 - layer 8, lazily
        return SyncBatchNorm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
