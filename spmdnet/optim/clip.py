"""Gradient clipping by global norm (``torch.nn.utils.clip_grad_norm_``)."""
import math

from ..backend import xp_of


def _grads(params):
    """The non-None gradients of one parameter or an iterable of them."""
    if hasattr(params, "data") and hasattr(params, "grad"):
        params = [params]
    return [p.grad for p in params if p.grad is not None]


def clip_grad_norm_(params, max_norm, norm_type=2.0):
    """Scale gradients in place so their global norm is at most ``max_norm``.

    The norm is taken over all gradients concatenated into one vector
    (``norm_type`` may be any p >= 1 or ``inf``). When
    ``max_norm / (total + 1e-6) < 1`` every gradient is multiplied by that
    factor, in place so that aliased gradient buffers see the change.
    Returns the total norm before clipping as a Python float. A NaN or inf
    total leaves the gradients untouched (the caller can test the result).

    The per-gradient reductions stay on the device and are summed there,
    so CuPy synchronises once, not once per parameter.
    """
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not max_norm >= 0.0:
        raise ValueError(f"Invalid max_norm: {max_norm}")
    if not norm_type > 0.0:
        raise ValueError(f"Invalid norm_type: {norm_type}")
    grads = _grads(params)
    if not grads:
        return 0.0
    xp = xp_of(*grads)
    parts = []
    for g in grads:
        if g.size == 0:
            continue
        if g.dtype.itemsize < 4:  # avoid float16 overflow in the reduction
            g = g.astype(xp.float32)
        if norm_type == math.inf:
            parts.append(xp.maximum(g.max(), -g.min()))  # no |g| temporary
        elif norm_type == 2.0:
            parts.append(xp.vdot(g.ravel(), g.ravel()).astype(xp.float64))
        else:
            parts.append((xp.abs(g) ** norm_type).sum(dtype=xp.float64))
    if not parts:
        return 0.0
    if norm_type == math.inf:
        total = float(xp.max(xp.stack(parts)))
    else:
        total = float(xp.sum(xp.stack(parts))) ** (1.0 / norm_type)
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g *= coef
    return total
