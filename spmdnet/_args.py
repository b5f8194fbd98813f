"""PyTorch's argument conventions, parsed in one place: devices
(``"cuda:0"``), dtypes, ``*size`` shapes, dims and the dtype a Python scalar
stands for.

A leaf (NumPy and the leaf ``_device``), so tensor creation (``creation.py``), the ops and
``nn.Module.to`` share these parsers without importing each other.
"""
import numpy as np

from ._device import default_device, device as as_device


def resolve_dtype(dtype):
    """``dtype`` (a NumPy dtype, type, or name) as a ``numpy.dtype``;
    Python's ``float``/``int``/``bool`` mean float64/int64/bool, as PyTorch."""
    return None if dtype is None else np.dtype(dtype)


def resolve_device(device, use_default=True):
    """``"cpu"`` or ``"gpu"`` for a device (a name or a ``device``); PyTorch's
    ``"cuda"`` and ``"cuda:N"`` mean this rank's GPU (each rank binds its own);
    ``"meta"`` stays ``"meta"`` (shape-only tensors, ``_device.MetaArray``).
    None stays None (keep/choose the usual place) unless ``use_default`` and a
    ``with spmdnet.device(...)`` block (or ``set_default_device``) names one."""
    if device is None:
        device = default_device() if use_default else None
        if device is None:
            return None
    if type(device) is str and device in ("cpu", "gpu"):
        return device
    try:
        kind = as_device(device).type
    except (TypeError, ValueError) as exc:
        raise ValueError(f"device must be 'cpu', 'gpu', 'cuda[:N]' or a spmdnet.device, "
                         f"got {device!r}") from exc
    if kind == "cpu":
        return "cpu"
    if kind == "cuda":
        return "gpu"
    if kind == "meta":
        return "meta"
    raise ValueError(f"spmdnet runs on 'cpu', 'cuda' and 'meta' devices, not {kind!r} "
                     f"({device!r})")


def shape_arg(shape):
    """``(*ints)`` or ``((ints),)`` -> a tuple of ints (PyTorch's ``*size``)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(n) for n in shape)


def canonical_dim(dim, ndim):
    """``dim`` in ``[0, ndim)`` (a 0-d tensor accepts -1 and 0), as PyTorch."""
    hi = max(ndim, 1)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"dim must be an int, got {dim!r}")
    if not -hi <= dim < hi:
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{-hi}, {hi - 1}], but got {dim})")
    return int(dim) % hi


def scalar_dtype(x, default_float):
    """The dtype a Python (or NumPy) scalar stands for in promotion."""
    if isinstance(x, (bool, np.bool_)):
        return np.dtype(bool)
    if isinstance(x, (int, np.integer)):
        return np.dtype(np.int64)
    if isinstance(x, complex):
        return np.dtype(np.complex64 if default_float == np.float32 else np.complex128)
    return default_float
