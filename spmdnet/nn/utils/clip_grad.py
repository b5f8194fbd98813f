"""Gradient clipping: ``torch.nn.utils.clip_grad_norm_``, ``clip_grad_value_``,
``get_total_norm`` and ``clip_grads_with_norm_`` (also reachable as
``spmdnet.optim.clip_grad_norm_`` and ``spmdnet.optim.clip_grad_value_``).

Local math only: the norm over gradients spread across ranks
(``spmdnet.parallel.clip_grad_norm_``, FSDP's and ZeRO's ``clip_grad_norm_``)
reduces ``norm_power`` over the ranks and clips with ``clip_grads_with_norm_``.

Gradients are changed in place, so aliased gradient buffers (DataParallel's
bucket views) see the change.
"""
import math

from ..._tensor import Tensor
from ...backend import xp_of
from ..parameter import grad_array


class TotalNorm(float):
    """The total norm clipping returns: a Python float that also answers
    ``.item()``, so PyTorch's ``norm.item()`` (on its 0-d tensor) runs unchanged."""

    def item(self):
        return float(self)


def grad_arrays(params):
    """The non-None gradient arrays of one parameter or an iterable of them."""
    if hasattr(params, "data") and hasattr(params, "grad"):
        params = [params]
    return [g for g in (grad_array(p) for p in params) if g is not None]


def check_norm_type(norm_type):
    """``norm_type`` as a float, ValueError unless it is some p > 0 or inf."""
    norm_type = float(norm_type)
    if not norm_type > 0.0:
        raise ValueError(f"Invalid norm_type: {norm_type}")
    return norm_type


def norm_power(arrays, norm_type, weights=None):
    """The sum over ``arrays`` of ``weight * sum(|a|^p)`` (p = ``norm_type``,
    ``weights`` one per array, default 1), a float; for p = inf the largest
    ``|a|`` (weights do not apply to a maximum). 0.0 for no elements.

    The per-array reductions stay on the device and are summed there, so
    CuPy synchronises once, not once per array."""
    norm_type = check_norm_type(norm_type)
    weights = [1.0] * len(arrays) if weights is None else list(weights)
    parts = []
    for a, w in zip(arrays, weights):
        if a.size == 0:
            continue
        xp = xp_of(a)
        if a.dtype.itemsize < 4:  # avoid float16 overflow in the reduction
            a = a.astype(xp.float32)
        if norm_type == math.inf:
            parts.append(xp.maximum(a.max(), -a.min()).astype(xp.float64))  # no |a| temporary
            continue
        if norm_type == 2.0:
            part = xp.vdot(a.ravel(), a.ravel()).astype(xp.float64)
        else:
            part = (xp.abs(a) ** norm_type).sum(dtype=xp.float64)
        parts.append(part if w == 1.0 else part * w)
    if not parts:
        return 0.0
    xp = xp_of(*parts)
    if norm_type == math.inf:
        return float(xp.max(xp.stack(parts)))
    return float(xp.sum(xp.stack(parts)))


def norm_from_power(power, norm_type):
    """The norm of order ``norm_type`` whose ``norm_power`` is ``power``."""
    norm_type = float(norm_type)
    return TotalNorm(power if norm_type == math.inf else power ** (1.0 / norm_type))


def check_finite(total, norm_type):
    """RuntimeError (PyTorch's message) when the total norm is NaN or inf."""
    if not math.isfinite(total):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                           "`parameters` is non-finite, so it cannot be clipped. To disable "
                           "this error and scale the gradients by the non-finite norm "
                           "anyway, set `error_if_nonfinite=False`")


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The norm of ``tensors`` (Tensors or arrays) concatenated into one vector."""
    tensors = [tensors] if hasattr(tensors, "shape") else tensors
    arrays = [t.array if isinstance(t, Tensor) else t for t in tensors if t is not None]
    total = norm_from_power(norm_power(arrays, norm_type), norm_type)
    if error_if_nonfinite:
        check_finite(total, norm_type)
    return total


def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
    """Scale the gradients by ``max_norm / (total_norm + 1e-6)`` when that is
    below 1 (or NaN: as PyTorch, a non-finite total still scales)."""
    scale_to_norm_(grad_arrays(parameters), max_norm, total_norm)


def scale_to_norm_(arrays, max_norm, total_norm):
    """``clip_grads_with_norm_`` on gradient arrays."""
    coef = float(max_norm) / (float(total_norm) + 1e-6)
    if not coef < 1.0 and not math.isnan(coef):
        return
    for g in arrays:
        g *= g.dtype.type(coef)


def check_max_norm(max_norm):
    max_norm = float(max_norm)
    if not max_norm >= 0.0:
        raise ValueError(f"Invalid max_norm: {max_norm}")
    return max_norm


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """Scale gradients in place so their global norm is at most ``max_norm``.

    The norm is taken over all gradients concatenated into one vector
    (``norm_type`` may be any p > 0 or ``inf``). When
    ``max_norm / (total + 1e-6) < 1`` every gradient is multiplied by that
    factor. Returns the total norm before clipping as a ``TotalNorm``, a
    Python float with ``.item()`` (PyTorch returns a 0-d tensor).

    A NaN or inf total raises RuntimeError with ``error_if_nonfinite=True``;
    otherwise, as PyTorch, the gradients are still multiplied by the
    (NaN or 0) factor. ``foreach`` is accepted for PyTorch's signature.
    """
    max_norm, norm_type = check_max_norm(max_norm), check_norm_type(norm_type)
    if hasattr(parameters, "data") and hasattr(parameters, "grad"):
        parameters = [parameters]
    parameters = list(parameters)
    total = get_total_norm(grad_arrays(parameters), norm_type, error_if_nonfinite)
    shards = [p for p in parameters if hasattr(p, "combine_shard_norms")]
    if shards:  # DTensor shards (fully_shard): the norm of the whole gradients
        total = shards[0].combine_shard_norms(total, norm_type, parameters)
    clip_grads_with_norm_(parameters, max_norm, total)
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient element to [-clip_value, clip_value] in place."""
    clip_value = float(clip_value)
    for g in grad_arrays(parameters):
        xp_of(g).clip(g, -clip_value, clip_value, out=g)
