"""Layers with PyTorch's names, arguments, shapes and default initialisation.

``device`` ("cpu" or "gpu") and ``dtype`` (default: ``sn.get_default_dtype()``)
are accepted as in PyTorch; parameters are initialised on the host from
spmdnet's generator, then moved, so a seed gives the same weights anywhere.
"""

import numpy as np

from .. import functional as F
from .._tensor import get_default_dtype
from . import init
from .activation import GELU, ReLU, Sigmoid, Tanh  # noqa: F401 - their historic home
from .module import Module
from .parameter import Parameter


def _empty(shape, dtype=None):
    """A host array for a parameter, filled by ``reset_parameters``."""
    return np.empty(shape, np.dtype(dtype or get_default_dtype()))


def _move(module, device):
    if device is not None:
        module.to(device)


class Linear(Module):
    """y = x @ weight.T + bias; weight (out, in). PyTorch's default init:
    ``kaiming_uniform_(weight, a=sqrt(5))`` (that is U(±1/sqrt(in))) and bias
    U(±1/sqrt(in))."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        if in_features < 0 or out_features < 0:
            raise ValueError(f"Linear: negative size ({in_features}, {out_features})")
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(_empty((out_features, in_features), dtype))
        self.bias = Parameter(_empty((out_features,), dtype)) if bias else None
        self.reset_parameters()
        _move(self, device)

    def reset_parameters(self):
        init.default_layer_init_(self.weight, self.bias)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Identity(Module):
    """Returns its input; any constructor arguments are ignored (as PyTorch)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class Flatten(Module):
    """``x.flatten(start_dim, end_dim)``; by default keeps the batch dim."""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """``x.unflatten(dim, unflattened_size)``: one dim becomes several."""

    def __init__(self, dim, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        return x.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class Dropout(Module):
    """Dropout in train mode, identity in eval mode."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class LayerNorm(Module):
    """Normalise over the last ``len(normalized_shape)`` dims; weight ones,
    bias zeros (``bias=False``: no bias; ``elementwise_affine=False``: neither)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(n) for n in normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight = self.bias = None
        if elementwise_affine:
            self.weight = Parameter(_empty(self.normalized_shape, dtype))
            if bias:
                self.bias = Parameter(_empty(self.normalized_shape, dtype))
        self.reset_parameters()
        _move(self, device)

    def reset_parameters(self):
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class Embedding(Module):
    """A lookup table (num_embeddings, embedding_dim), initialised N(0, 1).

    ``padding_idx``: that row starts at zero and receives no gradient (the
    output keeps whatever the row holds). ``_weight``: a given initial table;
    ``_freeze=True`` makes it not require grad."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 _freeze=False, device=None, dtype=None):
        super().__init__()
        if max_norm is not None or scale_grad_by_freq or sparse:
            raise NotImplementedError("Embedding: max_norm, scale_grad_by_freq and sparse "
                                      "are not supported")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx {padding_idx} must be within "
                                 f"num_embeddings {num_embeddings}")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = padding_idx
        if _weight is None:
            self.weight = Parameter(_empty((num_embeddings, embedding_dim), dtype))
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(f"Embedding: _weight has shape {tuple(_weight.shape)}, "
                                 f"expected {(num_embeddings, embedding_dim)}")
            self.weight = Parameter(_weight, requires_grad=not _freeze)
        _move(self, device)

    def reset_parameters(self):
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight.array[self.padding_idx] = 0

    def forward(self, indices):
        return F.embedding(indices, self.weight, self.padding_idx)

    def extra_repr(self):
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"
