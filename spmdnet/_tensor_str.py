"""PyTorch's text for a tensor (``repr``, ``str``): ``tensor([0.5000, 1.0000])``,
``tensor([1., 2.], dtype=torch.float64)``, ``tensor(6., grad_fn=<SumBackward0>)``.

As ``torch/_tensor_str.py`` decides: floats print with 4 decimals, as
integers (``2.``) when every finite value is one, and in scientific notation
when the finite magnitudes span more than 1000x or leave [1e-4, 1e8]; every
element is padded to the widest; more than 1000 elements are summarised with
3 at each edge; lines wrap at 80 characters. The dtype is noted unless it is
the default float dtype (or its complex twin), int64 or bool. Dtype names
print as PyTorch's (``torch.float64``), as ``Tensor.type()`` does.
"""
import math

import numpy as np

from ._device import is_meta_array
from .backend import asnumpy, is_cupy_array

PRECISION, THRESHOLD, EDGEITEMS, LINEWIDTH = 4, 1000, 3, 80


def _summarised(arr):
    """The elements that will be shown: each long dim cut to its edges."""
    for axis, n in enumerate(arr.shape):
        if n > 2 * EDGEITEMS:
            keep = list(range(EDGEITEMS)) + list(range(n - EDGEITEMS, n))
            arr = np.take(arr, keep, axis=axis)
    return arr


def _float_format(values):
    """The format function for a floating array's shown ``values``."""
    finite = values[np.isfinite(values)]
    nonzero = np.abs(finite[finite != 0]).astype(np.float64)
    if nonzero.size == 0:
        integral = True
    else:
        integral = bool(np.all(np.ceil(finite) == finite))
    if nonzero.size:
        lo, hi = float(nonzero.min()), float(nonzero.max())
        spread = hi / lo > 1000.0 or hi > 1.0e8
        scientific = spread or (not integral and lo < 1.0e-4)
    else:
        scientific = False
    if scientific:
        return lambda v: f"{v:.{PRECISION}e}"
    if integral:
        return lambda v: f"{v:.0f}." if math.isfinite(v) else f"{v}"
    return lambda v: f"{v:.{PRECISION}f}"


def _formatter(arr):
    """(format function, width) for the elements of ``arr`` (host array)."""
    shown = _summarised(arr).ravel() if arr.size > THRESHOLD else arr.ravel()
    kind = arr.dtype.kind
    if kind == "f":
        fmt = _float_format(shown)
    elif kind == "c":
        real, imag = _float_format(shown.real), _float_format(shown.imag)

        def fmt(v):
            im = imag(abs(v.imag)) if not math.isnan(v.imag) else "nan"
            return f"{real(v.real)}{'-' if v.imag < 0 else '+'}{im}j"
    else:  # integers, bools
        fmt = str
    # as PyTorch: with no nonzero finite value, no padding (``tensor([-0., 0.])``)
    measured = shown.tolist() if kind not in "fc" or np.any(np.isfinite(shown) & (shown != 0)) \
        else []
    width = max((len(fmt(v)) for v in measured), default=0)
    return fmt, width


def _body(arr, fmt, width, indent, summarise):
    """The bracketed text of ``arr`` (a host array of ndim >= 1)."""
    n = arr.shape[0]
    cut = summarise and n > 2 * EDGEITEMS
    rows = list(range(EDGEITEMS)) + [None] + list(range(n - EDGEITEMS, n)) if cut \
        else list(range(n))
    if arr.ndim == 1:
        items = [" ..." if i is None else fmt(arr[i].item()).rjust(width) for i in rows]
        per_line = max(1, (LINEWIDTH - indent) // (width + 2))
        lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
        return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"
    parts = ["..." if i is None else _body(arr[i], fmt, width, indent + 1, summarise)
             for i in rows]
    return "[" + ("," + "\n" * (arr.ndim - 1) + " " * (indent + 1)).join(parts) + "]"


def _notes(t, arr, default_dtype):
    """PyTorch's suffixes: device, size (empty), dtype, grad_fn / requires_grad."""
    notes = []
    if is_cupy_array(t.array):
        notes.append(f"device='cuda:{t.array.device.id}'")
    if arr.size == 0 and arr.shape != (0,):
        notes.append(f"size={tuple(arr.shape)}")
    plain = {np.dtype(default_dtype), np.result_type(default_dtype, np.complex64),
             np.dtype(np.int64), np.dtype(np.bool_)}
    if arr.dtype not in plain:
        notes.append(f"dtype=torch.{arr.dtype.name}")
    ctx = t._ctx
    if ctx is not None:
        notes.append(f"grad_fn=<{getattr(ctx, 'freed', type(ctx).__name__)}Backward0>")
    elif t.requires_grad:
        notes.append("requires_grad=True")
    return notes


def tensor_repr(t, default_dtype):
    """PyTorch's ``repr`` of Tensor ``t``; ``default_dtype``: the default
    floating dtype (left unnoted)."""
    if is_meta_array(t.array):  # no data to show: PyTorch's "..." with the device and size
        arr = t.array
        notes = [n for n in _notes(t, arr, default_dtype) if not n.startswith("size=")]
        if arr.dtype in (np.int64, np.bool_):
            notes.insert(0, f"dtype=torch.{arr.dtype.name}")
        return ", ".join(["tensor(...", "device='meta'", f"size={tuple(arr.shape)}"] + notes) + ")"
    arr = asnumpy(t.array)
    prefix = "tensor("
    if arr.size == 0:
        body = "[]"
    else:
        fmt, width = _formatter(arr)
        if arr.ndim == 0:
            body = fmt(arr.item())
        else:
            body = _body(arr, fmt, width, len(prefix), arr.size > THRESHOLD)
    notes = _notes(t, arr, default_dtype)
    return prefix + ", ".join([body] + notes) + ")"
