"""Gradient clipping (``torch.nn.utils.clip_grad_norm_`` and ``clip_grad_value_``;
also reachable as ``spmdnet.nn.utils.*`` and ``spmdnet.optim.clip_grad_norm_``).

Gradients are changed in place, so aliased gradient buffers (DataParallel's
bucket views) see the change.
"""
import math

from ..backend import xp_of
from ..nn.parameter import grad_array


class TotalNorm(float):
    """The total norm clipping returns: a Python float that also answers
    ``.item()``, so PyTorch's ``norm.item()`` (on its 0-d tensor) runs unchanged."""

    def item(self):
        return float(self)


def _grads(params):
    """The non-None gradient arrays of one parameter or an iterable of them."""
    if hasattr(params, "data") and hasattr(params, "grad"):
        params = [params]
    return [g for g in (grad_array(p) for p in params) if g is not None]


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

    The per-gradient reductions stay on the device and are summed there,
    so CuPy synchronises once, not once per parameter.
    """
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not max_norm >= 0.0:
        raise ValueError(f"Invalid max_norm: {max_norm}")
    if not norm_type > 0.0:
        raise ValueError(f"Invalid norm_type: {norm_type}")
    grads = _grads(parameters)
    if not grads:
        return TotalNorm(0.0)
    xp = xp_of(*grads)
    parts = []
    for g in grads:
        if g.size == 0:
            continue
        if g.dtype.itemsize < 4:  # avoid float16 overflow in the reduction
            g = g.astype(xp.float32)
        if norm_type == math.inf:
            parts.append(xp.maximum(g.max(), -g.min()).astype(xp.float64))  # no |g| temporary
        elif norm_type == 2.0:
            parts.append(xp.vdot(g.ravel(), g.ravel()).astype(xp.float64))
        else:
            parts.append((xp.abs(g) ** norm_type).sum(dtype=xp.float64))
    if not parts:
        return TotalNorm(0.0)
    if norm_type == math.inf:
        total = TotalNorm(float(xp.max(xp.stack(parts))))
    else:
        total = TotalNorm(float(xp.sum(xp.stack(parts))) ** (1.0 / norm_type))
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                           "`parameters` is non-finite, so it cannot be clipped. To disable "
                           "this error and scale the gradients by the non-finite norm "
                           "anyway, set `error_if_nonfinite=False`")
    coef = max_norm / (total + 1e-6)
    if not coef < 1.0 and not math.isnan(coef):
        return total
    for g in grads:
        g *= g.dtype.type(coef)
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient element to [-clip_value, clip_value] in place."""
    clip_value = float(clip_value)
    for g in _grads(parameters):
        xp_of(g).clip(g, -clip_value, clip_value, out=g)
