"""Tensor methods that are not math: ``clone``, ``requires_grad_``,
``softmax`` / ``log_softmax`` (dim required, as PyTorch's methods), the
``new_*`` factories (this tensor's dtype and device by default),
``is_contiguous`` and ``type`` (the random fills are in ops/sampling.py).

``type()`` with no argument returns PyTorch's type string
(``'torch.FloatTensor'``, ``'torch.cuda.LongTensor'``, ...); ``type(dtype)``
casts (a dtype, or one of those strings), returning the tensor itself when
nothing changes.
"""
import numpy as np

from .. import creation
from .._args import canonical_dim, shape_arg
from ..autograd import Function
from ..backend import is_cupy_array
from ..dtypes import bfloat16 as _bfloat16
from ..dtypes import is_floating
from .convert import cast, to
from .nn_ops import LogSoftmax, Softmax


class Clone(Function):
    def forward(self, a):
        return a.copy()

    def backward(self, g):
        return g


def clone(input, *, memory_format=None):  # noqa: A002 - PyTorch's argument name
    """A copy of ``input`` that stays in the graph (the gradient passes through)."""
    return Clone.apply(input)


def requires_grad_(self, requires_grad=True):
    """Set ``requires_grad`` in place and return the tensor; a non-leaf can
    only keep requiring grad, as PyTorch."""
    if self._ctx is not None and not requires_grad:
        raise RuntimeError("you can only change requires_grad flags of leaf variables. If you "
                           "want to use a computed variable in a subgraph that doesn't require "
                           "differentiation use var_no_grad = var.detach().")
    self.requires_grad = requires_grad
    return self


def _softmax(cls):
    def method(self, dim, dtype=None):
        x = self if dtype is None else cast(self, dtype)
        return cls.apply(x, axis=canonical_dim(dim, x.ndim))
    method.__name__ = cls.__name__.lower()
    return method


softmax, log_softmax = _softmax(Softmax), _softmax(LogSoftmax)


def _defaults(self, dtype, device):
    return (self.dtype if dtype is None else dtype,
            self.device if device is None else device)


def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
    dtype, device = _defaults(self, dtype, device)
    return creation.zeros(shape_arg(size), dtype=dtype, device=device,
                          requires_grad=requires_grad)


def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
    dtype, device = _defaults(self, dtype, device)
    return creation.ones(shape_arg(size), dtype=dtype, device=device,
                         requires_grad=requires_grad)


def new_empty(self, *size, dtype=None, device=None, requires_grad=False):
    dtype, device = _defaults(self, dtype, device)
    return creation.empty(shape_arg(size), dtype=dtype, device=device,
                          requires_grad=requires_grad)


def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False):
    dtype, device = _defaults(self, dtype, device)
    return creation.full(shape_arg((size,)), fill_value, dtype=dtype, device=device,
                         requires_grad=requires_grad)


def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
    """A new leaf holding a copy of ``data``, in this tensor's dtype and device
    unless given (a list of ints on a float tensor gives floats, as PyTorch)."""
    dtype, device = _defaults(self, dtype, device)
    return creation.tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)


def is_contiguous(self, memory_format=None):
    """Whether the data is C-contiguous (a transposed view is not)."""
    return bool(self.array.flags.c_contiguous)


_TYPE_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
               "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char",
               "uint8": "Byte", "bool": "Bool", "complex64": "ComplexFloat",
               "complex128": "ComplexDouble"}
_TYPE_DTYPES = {f"{name}Tensor": np.dtype(d) for d, name in _TYPE_NAMES.items()}


def type(self, dtype=None, non_blocking=False):  # noqa: A001 - PyTorch's method name
    """No argument: PyTorch's type string (``'torch.FloatTensor'``); a dtype
    or such a string: the tensor cast to it (itself when it already is)."""
    if dtype is None:
        gpu = ".cuda" if is_cupy_array(self.array) else ""
        return f"torch{gpu}.{_TYPE_NAMES.get(self.dtype.name, self.dtype.name)}Tensor"
    if isinstance(dtype, str) and dtype.startswith("torch."):
        name = dtype.rsplit(".", 1)[1]
        if name not in _TYPE_DTYPES:
            raise ValueError(f"invalid type: {dtype!r}")
        return to(self, "gpu" if ".cuda." in dtype else "cpu", _TYPE_DTYPES[name])
    return cast(self, dtype)


def bfloat16(self, memory_format=None):
    """``self`` as bfloat16 (rounded to nearest even; itself when it already is)."""
    return cast(self, _bfloat16)


def is_floating_point(self):
    """Whether the dtype is a floating one (float16/32/64, bfloat16)."""
    return is_floating(self.dtype)


def _on(kind):
    """``Tensor.is_<kind>``: whether the tensor's device is of this type."""
    return property(lambda self: self.device.type == kind)


# PyTorch 2.13's device and layout predicates (properties, as on torch.Tensor):
# a device type each, and layouts and quantization spmdnet never makes
DEVICE_PREDICATES = {f"is_{kind}": _on(kind) for kind in
                     ("cpu", "xpu", "mps", "meta", "ipu", "maia", "mtia", "vulkan", "xla")}
ALWAYS_FALSE = {name: property(lambda self: False) for name in
                ("is_quantized", "is_sparse", "is_sparse_csr", "is_mkldnn", "is_nested")}

METHODS = {
    **DEVICE_PREDICATES, **ALWAYS_FALSE,
    "clone": clone, "requires_grad_": requires_grad_, "softmax": softmax,
    "log_softmax": log_softmax, "new_zeros": new_zeros, "new_ones": new_ones,
    "new_empty": new_empty, "new_full": new_full, "new_tensor": new_tensor,
    "is_contiguous": is_contiguous, "type": type, "bfloat16": bfloat16,
    "is_floating_point": is_floating_point,
}
