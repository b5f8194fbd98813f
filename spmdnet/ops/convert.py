"""Type and device conversions with PyTorch's names: ``float()``,
``double()``, ``half()``, ``long()``, ``int()``, ``bool()``, ``to(...)``,
``type_as``, ``cpu()`` / ``cuda()``, and NumPy interop (``__array_ufunc__``).

A conversion between floating dtypes, and a move between devices, stay in
the graph (the gradient is cast or moved back), as in PyTorch; a conversion
to an integer or bool dtype leaves it.
"""
import numpy as np

from .._args import resolve_device, resolve_dtype
from .._device import device as Device, device_of_array
from .._tensor import Tensor
from ..autograd import Function
from ..backend import device_of, to_device
from .arith import Cast


def _is_float(dtype):
    return dtype.kind in "fcV"  # "V": bfloat16 (dtypes.py)


class ToDevice(Function):
    def forward(self, a, device):
        self.device = device_of(a)
        return to_device(a, device)

    def backward(self, g):
        return to_device(g, self.device)


def cast(a, dtype, copy=False):
    """``a`` as ``dtype``: itself when it already is (unless ``copy``); in the
    graph between floating dtypes, outside it otherwise."""
    dtype = resolve_dtype(dtype)
    if dtype == a.dtype and not copy:
        return a
    if _is_float(dtype) and _is_float(a.dtype):
        return Cast.apply(a, dtype=dtype)
    return Tensor(a.array.astype(dtype))


def to(a, *args, dtype=None, device=None, non_blocking=False, copy=False):
    """PyTorch's ``to``: ``to(dtype)``, ``to(device)``, ``to(device, dtype)``,
    ``to(other_tensor)``, or keywords. Returns ``a`` when nothing changes."""
    for arg in args:
        if isinstance(arg, Tensor):
            dtype, device = arg.dtype, arg.device
        elif isinstance(arg, (str, Device)):
            device = arg
        else:
            dtype = arg
    device = resolve_device(device, use_default=False)  # None: stay where it is
    out = a
    if device is not None and device != device_of_array(a.array):  # meta is not "cpu"
        out = ToDevice.apply(a, device=device)
    if dtype is not None:
        out = cast(out, dtype, copy=copy and out is a)
    elif copy and out is a:
        out = cast(a, a.dtype, copy=True)
    return out


def type_as(a, other):
    """``a`` with ``other``'s dtype (and device, as PyTorch's ``type_as``)."""
    return to(a, other)


def cpu(a):
    return to(a, "cpu")


def cuda(a, device=None, non_blocking=False):
    """``a`` on this rank's GPU: ``device`` (an ordinal, "cuda:N") is accepted
    for PyTorch's sake; each rank binds its own GPU (distributed runtime)."""
    if device is not None and resolve_device(device if not isinstance(device, int)
                                             else Device("cuda", device)) != "gpu":
        raise ValueError(f"cuda() takes a CUDA device, got {device!r}")
    return to(a, "gpu")


def _caster(dtype, name):
    def convert(a):
        return cast(a, dtype)
    convert.__name__ = name
    convert.__doc__ = f"``a`` as {np.dtype(dtype)} (itself when it already is)."
    return convert


CASTS = {"float": _caster(np.float32, "float"), "double": _caster(np.float64, "double"),
         "half": _caster(np.float16, "half"), "long": _caster(np.int64, "long"),
         "int": _caster(np.int32, "int"), "short": _caster(np.int16, "short"),
         "char": _caster(np.int8, "char"), "byte": _caster(np.uint8, "byte"),
         "bool": _caster(np.bool_, "bool")}

# NumPy ufunc -> (Tensor method, reflected method): `ndarray OP tensor` stays in the graph
_OPERATORS = {
    np.add: ("__add__", "__radd__"), np.subtract: ("__sub__", "__rsub__"),
    np.multiply: ("__mul__", "__rmul__"), np.true_divide: ("__truediv__", "__rtruediv__"),
    np.power: ("__pow__", "__rpow__"), np.matmul: ("__matmul__", "__rmatmul__"),
    np.less: ("__lt__", "__gt__"), np.less_equal: ("__le__", "__ge__"),
    np.greater: ("__gt__", "__lt__"), np.greater_equal: ("__ge__", "__le__"),
    np.equal: ("__eq__", "__eq__"), np.not_equal: ("__ne__", "__ne__"),
}


def array_ufunc(self, ufunc, method, *inputs, **kwargs):
    """NumPy ufuncs on tensors. An operator between an array and a tensor
    (``ndarray + t``) is the tensor's own op, so the graph is kept. Any other
    ufunc on a tensor that requires grad raises (it would silently drop the
    graph; PyTorch raises too); on other tensors it runs on the arrays and
    returns tensors."""
    if method == "__call__" and not kwargs and len(inputs) == 2 and ufunc in _OPERATORS:
        a, b = inputs
        forward, reflected = _OPERATORS[ufunc]
        out = getattr(a, forward)(b) if isinstance(a, Tensor) else getattr(b, reflected)(a)
        if out is not NotImplemented:
            return out
    outs = kwargs.get("out", ())
    if any(isinstance(x, Tensor) and x.requires_grad for x in inputs + tuple(outs)):
        raise RuntimeError(f"numpy.{ufunc.__name__} on a tensor that requires grad would "
                           "drop it from the graph: use the tensor's own method, or "
                           ".detach() it first")
    args = [x.array if isinstance(x, Tensor) else x for x in inputs]
    if outs:
        kwargs["out"] = tuple(x.array if isinstance(x, Tensor) else x for x in outs)
    result = getattr(ufunc, method)(*args, **kwargs)
    if outs:
        return outs if len(outs) > 1 else outs[0]
    if isinstance(result, tuple):
        return tuple(_wrap(r) for r in result)
    return None if result is None else _wrap(result)


def _wrap(result):
    return Tensor(np.asarray(result) if isinstance(result, (np.generic, bool)) else result)
