"""Helpers shared by the ops: undoing broadcasting, normalising axes."""


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
