"""Parameter initialisation from spmdnet's own generator (``sn.manual_seed``)."""
import math

from ..random import generator
from .._tensor import get_default_dtype


def uniform(shape, bound, dtype=None):
    """A host array drawn uniformly from [-bound, bound)."""
    dtype = dtype or get_default_dtype()
    return generator().uniform(-bound, bound, size=shape).astype(dtype)


def normal(shape, std=1.0, dtype=None):
    """A host array drawn from N(0, std²)."""
    dtype = dtype or get_default_dtype()
    return (generator().standard_normal(size=shape) * std).astype(dtype)


def linear_bound(in_features):
    """PyTorch's default bound for Linear weight and bias: 1/sqrt(in)."""
    return 1.0 / math.sqrt(in_features) if in_features > 0 else 0.0
