"""PyTorch's ``torch.nn.modules``: one file per family of layers, PyTorch's
file names, so each class's ``__module__`` is the path a pickle records
(``spmdnet.nn.modules.linear.Linear`` for ``torch.nn.modules.linear.Linear``)."""
from .activation import ELU, GELU, Hardtanh, LeakyReLU, LogSoftmax, MultiheadAttention, ReLU, \
    ReLU6, Sigmoid, SiLU, Softmax, Softplus, Tanh
from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm
from .container import ModuleDict, ModuleList, ModuleSequence, ParameterList, Sequential
from .conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
from .dropout import AlphaDropout, Dropout, Dropout1d, Dropout2d, Dropout3d, FeatureAlphaDropout
from .flatten import Flatten, Unflatten
from .instancenorm import InstanceNorm1d, InstanceNorm2d
from .linear import Identity, Linear
from .loss import BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, KLDivLoss, L1Loss, \
    MSELoss, NLLLoss, SmoothL1Loss
from .module import Module
from .normalization import GroupNorm, LayerNorm
from .pooling import AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, MaxPool2d
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from .sparse import Embedding
from .transformer import Transformer, TransformerDecoder, TransformerDecoderLayer, \
    TransformerEncoder, TransformerEncoderLayer
from .upsampling import Upsample

__all__ = ["Module", "Linear", "Identity", "Sequential", "ModuleList", "ModuleDict",
           "ParameterList", "ModuleSequence", "ReLU", "ReLU6", "Hardtanh", "GELU", "Tanh",
           "Sigmoid", "SiLU", "LeakyReLU", "ELU", "Softplus", "Softmax", "LogSoftmax",
           "MultiheadAttention",
           "Flatten", "Unflatten", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
           "AlphaDropout", "FeatureAlphaDropout", "LayerNorm", "GroupNorm", "InstanceNorm1d",
           "InstanceNorm2d", "Embedding", "Conv1d", "Conv2d", "ConvTranspose1d",
           "ConvTranspose2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d",
           "Upsample", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm",
           "CrossEntropyLoss",
           "NLLLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss",
           "BCEWithLogitsLoss", "KLDivLoss", "RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase",
           "RNNCell", "LSTMCell", "GRUCell", "Transformer", "TransformerEncoder",
           "TransformerDecoder", "TransformerEncoderLayer", "TransformerDecoderLayer"]
