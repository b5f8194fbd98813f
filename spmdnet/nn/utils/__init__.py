"""``nn.utils``: PyTorch's gradient clipping (``clip_grad``; ``optim.clip_grad_norm_``
is the same function) and parameter/vector conversions.
"""
from .. import functional as F
from ..._tensor import Tensor
from ...backend import xp_of
from .clip_grad import clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_, get_total_norm

__all__ = ["clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm",
           "parameters_to_vector", "vector_to_parameters"]


def parameters_to_vector(parameters):
    """One 1-D tensor of every parameter flattened, in order (differentiable)."""
    return F.concatenate([p.reshape(-1) for p in parameters], 0)


def vector_to_parameters(vec, parameters):
    """Copy consecutive slices of the 1-D ``vec`` into the parameters' values.

    Unlike PyTorch, which rebinds each ``param.data`` to a view of ``vec``,
    the values are copied in place: views onto parameters (DataParallel's
    buckets, an optimizer's state) stay valid, and ``vec`` is not aliased."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected Tensor, but got: {type(vec).__name__}")
    if vec.ndim != 1:
        raise ValueError(f"vec must be 1-D, got shape {tuple(vec.shape)}")
    params = list(parameters)
    total = sum(p.array.size for p in params)
    if total != vec.shape[0]:
        raise ValueError(f"vector_to_parameters: vec has {vec.shape[0]} elements, the "
                         f"parameters hold {total}")
    offset = 0
    for p in params:
        n = p.array.size
        p.array[...] = xp_of(p.array).asarray(vec.array[offset:offset + n]).reshape(p.array.shape)
        offset += n
