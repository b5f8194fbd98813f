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


class Sequential(Module):
    """Modules applied in order, registered as "0", "1", ...

    A ``Linear`` followed by ``ReLU``, ``GELU``, ``Tanh`` or ``Sigmoid`` runs
    as one fused op (``F.linear(..., activation=...)``): the same values, and
    the activation is applied in place on the product's output."""

    def __init__(self, *modules):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def forward(self, x):
        modules = list(self._modules.values())
        i = 0
        while i < len(modules):
            m = modules[i]
            activation = _fusable_activation(modules[i + 1]) if (
                type(m) is Linear and i + 1 < len(modules)) else None
            if activation is not None:
                x = F.linear(x, m.weight, m.bias, activation=activation)
                i += 2
            else:
                x = m(x)
                i += 1
        return x


def _fusable_activation(module):
    """The F.linear activation name for an activation module, else None."""
    kind = type(module)
    if kind is GELU:
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    return {ReLU: "relu", Tanh: "tanh", Sigmoid: "sigmoid"}.get(kind)


class ModuleList(Module):
    """A list of modules, registered as "0", "1", ..."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module):
        setattr(self, str(len(self._modules)), module)
        return self

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


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
