"""Helpers shared by the ops: undoing broadcasting, normalising axes."""
import numpy as np


def unbroadcast(grad, shape):
    """Sum ``grad`` down to ``shape``, undoing NumPy broadcasting.

    The one place broadcasting is undone: leading axes that broadcasting
    added are summed away, then axes where the input had size 1.
    Returns ``grad`` itself when nothing was broadcast.
    """
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(
        i + extra for i, n in enumerate(shape) if n == 1 and grad.shape[i + extra] != 1)
    out = grad.sum(axis=axes, keepdims=True) if axes else grad
    return out.reshape(shape)


def normalize_axes(axis, ndim):
    """``axis`` (None, int or tuple) as a sorted tuple of non-negative ints."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            raise ValueError(f"axis {a} is out of bounds for a tensor with {ndim} dimensions")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(out))


def expand_reduced(grad, shape, axes, keepdims):
    """Reshape the gradient of a reduction so it broadcasts against ``shape``."""
    if keepdims:
        return grad
    return grad.reshape([1 if i in axes else n for i, n in enumerate(shape)])


def dim_arg(name, dim, axis, keepdim=False, keepdims=None):
    """``(dim, keepdim)`` from PyTorch's names and NumPy's aliases (``axis=``,
    ``keepdims=``), raising when both spellings are given."""
    if axis is not None:
        if dim is not None:
            raise TypeError(f"{name}() got both dim={dim!r} and axis={axis!r}")
        dim = axis
    if keepdims is not None:
        keepdim = keepdims
    return dim, bool(keepdim)


# PyTorch's type promotion (torch.result_type). Categories: bool < integer <
# floating < complex. Operands are ranked dimensioned tensor > 0-dim tensor >
# Python scalar; a lower rank decides the result only when its category is
# higher, and then a Python float stands for the default float dtype.
_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "V": 2, "c": 3}  # "V": bfloat16 (dtypes.py)


def promote_types(a, b):
    """The smallest dtype holding both, PyTorch's table: across categories the
    higher category's dtype wins (int64 with float32 is float32)."""
    if a == b:
        return a
    ca, cb = _CATEGORY[a.kind], _CATEGORY[b.kind]
    if ca != cb:
        return a if ca > cb else b
    return np.promote_types(a, b)


def _combine(higher, lower):
    """PyTorch's combine_categories: ``higher`` from higher-ranked operands
    wins unless ``lower`` is of a higher category (or ``higher`` is bool)."""
    if higher is None or lower is None:
        return lower if higher is None else higher
    if _CATEGORY[higher.kind] < _CATEGORY[lower.kind] or higher.kind == "b":
        return promote_types(higher, lower)
    return higher


def result_type(dims, zeros, scalars):
    """The result dtype of an op over dimensioned-tensor dtypes ``dims``,
    0-dim tensor dtypes ``zeros`` and Python-scalar dtypes ``scalars``."""
    slots = []
    for group in (dims, zeros, scalars):
        out = None
        for d in group:
            out = d if out is None else promote_types(out, d)
        slots.append(out)
    return _combine(slots[0], _combine(slots[1], slots[2]))
