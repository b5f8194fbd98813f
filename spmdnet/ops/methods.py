"""Tensor methods that are not math: ``clone``, ``requires_grad_``,
``softmax`` / ``log_softmax`` (dim required, as PyTorch's methods), the
``new_*`` factories (this tensor's dtype and device by default), the
in-place random fills ``normal_`` / ``uniform_`` (spmdnet's generator, as
``nn.init``), ``is_contiguous`` and ``type``.

``type()`` with no argument returns PyTorch's type string
(``'torch.FloatTensor'``, ``'torch.cuda.LongTensor'``, ...); ``type(dtype)``
casts (a dtype, or one of those strings), returning the tensor itself when
nothing changes.
"""
import numpy as np

from .. import creation
from .._args import canonical_dim, shape_arg
from ..autograd import Function
from ..backend import is_cupy_array, xp_of
from ..random import generator as default_generator
from .convert import cast, to
from .inplace import _no_graph
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


def _fill(self, name, draw, generator):
    """Fill in place with ``draw(generator, shape)``, drawn on the host as
    ``nn.init`` draws (the same seed gives the same values on CPU and GPU).
    (``nn.init`` imports the layers, which import the ops: not from here.)"""
    _no_graph(self, name)
    values = draw(default_generator() if generator is None else generator, self.shape)
    self.array[...] = xp_of(self.array).asarray(values).astype(self.dtype, copy=False)
    return self


def normal_(self, mean=0.0, std=1.0, *, generator=None):
    """Fill in place with N(mean, std²) from spmdnet's generator (as ``nn.init.normal_``)."""
    return _fill(self, "normal_", lambda g, shape: mean + std * g.standard_normal(shape),
                 generator)


def uniform_(self, *bounds, generator=None, **names):
    """Fill in place with U(from, to) (defaults 0 and 1; PyTorch's argument
    names ``from``/``to`` as keywords) from spmdnet's generator."""
    lo, hi = (list(bounds) + [names.pop("from", 0.0), names.pop("to", 1.0)][len(bounds):])[:2]
    if names:
        raise TypeError(f"uniform_() got unexpected keyword arguments {sorted(names)}")
    return _fill(self, "uniform_", lambda g, shape: g.uniform(lo, hi, size=shape), generator)


def is_contiguous(self, memory_format=None):
    """Whether the data is C-contiguous (a transposed view is not)."""
    return bool(self.array.flags.c_contiguous)


_TYPE_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half",
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


METHODS = {
    "clone": clone, "requires_grad_": requires_grad_, "softmax": softmax,
    "log_softmax": log_softmax, "new_zeros": new_zeros, "new_ones": new_ones,
    "new_empty": new_empty, "new_full": new_full, "new_tensor": new_tensor,
    "normal_": normal_, "uniform_": uniform_, "is_contiguous": is_contiguous, "type": type,
}
