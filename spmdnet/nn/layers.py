"""Layers with PyTorch's names, shapes and default initialisation."""
import numpy as np

from .. import functional as F
from .._tensor import get_default_dtype
from . import init
from .module import Module
from .parameter import Parameter


class Linear(Module):
    """y = x @ weight.T + bias; weight (out, in), both uniform(±1/sqrt(in))."""

    def __init__(self, in_features, out_features, bias=True, dtype=None):
        super().__init__()
        if in_features < 0 or out_features < 0:
            raise ValueError(f"Linear: negative size ({in_features}, {out_features})")
        self.in_features, self.out_features = in_features, out_features
        bound = init.linear_bound(in_features)
        self.weight = Parameter(init.uniform((out_features, in_features), bound, dtype))
        self.bias = Parameter(init.uniform((out_features,), bound, dtype)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class Sigmoid(Module):
    def forward(self, x):
        return F.sigmoid(x)


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)


class Identity(Module):
    def forward(self, x):
        return x


class Dropout(Module):
    """Dropout in train mode, identity in eval mode."""

    def __init__(self, p=0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)


class LayerNorm(Module):
    """Normalise over the last axis; weight ones and bias zeros."""

    def __init__(self, dim, eps=1e-5, elementwise_affine=True, dtype=None):
        super().__init__()
        self.dim, self.eps = dim, eps
        dtype = dtype or get_default_dtype()
        self.weight = Parameter(np.ones(dim, dtype)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(dim, dtype)) if elementwise_affine else None

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class Embedding(Module):
    """A lookup table (num_embeddings, embedding_dim), initialised N(0, 1)."""

    def __init__(self, num_embeddings, embedding_dim, dtype=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(init.normal((num_embeddings, embedding_dim), 1.0, dtype))

    def forward(self, indices):
        return F.embedding(indices, self.weight)
