"""Modules and layers (``spmdnet.nn``), PyTorch's names and state_dict keys."""
from . import functional, init, utils
from .attention import MultiheadAttention
from .activation import ELU, GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, \
    Softplus, Tanh
from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
from .data_parallel import DataParallel
from .containers import ModuleDict, ModuleList, ModuleSequence, ParameterList, Sequential
from .layers import Dropout, Embedding, Flatten, Identity, LayerNorm, Linear, Unflatten
from .loss import BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, KLDivLoss, L1Loss, \
    MSELoss, NLLLoss, SmoothL1Loss
from .module import Module
from .normalization import GroupNorm, InstanceNorm1d, InstanceNorm2d
from .pooling import AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, MaxPool2d, Upsample
from .parameter import Parameter
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from .transformer import Transformer, TransformerDecoder, TransformerDecoderLayer, \
    TransformerEncoder, TransformerEncoderLayer

__all__ = ["Module", "Parameter", "Linear", "Sequential", "ModuleList", "ModuleDict",
           "ParameterList", "ReLU", "GELU", "Tanh", "Sigmoid", "SiLU", "LeakyReLU", "ELU",
           "Softplus", "Softmax", "LogSoftmax", "Identity", "Flatten", "Unflatten", "Dropout",
           "LayerNorm", "Embedding", "functional", "init", "utils", "ModuleSequence",
           "Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d",
           "AdaptiveMaxPool2d", "Upsample", "MultiheadAttention",
           "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm",
           "CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss",
           "BCELoss", "BCEWithLogitsLoss", "KLDivLoss"]
__all__ += ["DataParallel"]  # PyTorch's single-process wrapper (data_parallel.py)
__all__ += ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]
__all__ += ["Transformer", "TransformerEncoder", "TransformerDecoder",
            "TransformerEncoderLayer", "TransformerDecoderLayer"]
__all__ += ["GroupNorm", "InstanceNorm1d", "InstanceNorm2d"]
__all__ += ["ConvTranspose1d", "ConvTranspose2d"]


def __getattr__(name):
    """``nn.SyncBatchNorm`` (PyTorch's path): the layer reduces over MPI, so it
    lives with the strategies (``spmdnet.parallel.sync_batchnorm``, layer 8);
    it is imported at first use, nn (layer 5) never imports parallel at load."""
    if name == "SyncBatchNorm":
        from ..parallel.sync_batchnorm import SyncBatchNorm  # noqa: PLC0415 - layer 8, lazily
        return SyncBatchNorm
    if name == "parallel":  # nn.parallel.DistributedDataParallel, loaded at first use (24b)
        import importlib  # noqa: PLC0415 - nn.parallel imports the strategies (layer 8)
        return importlib.import_module(f"{__name__}.parallel")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
