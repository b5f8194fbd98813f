"""Tensor: an array with an optional gradient and the graph that produced it.

A Tensor wraps a NumPy or CuPy array. Every differentiable operation is a
``spmdnet.autograd.Function`` subclass (in ``spmdnet.ops``) whose ``apply``
records, when a gradient is needed, the function as the result's ``_ctx``
with its input tensors as ``parents``; ``spmdnet.autograd.engine`` walks that
graph. (The module is ``_tensor``, as PyTorch's ``torch/_tensor.py``, because
the package attribute ``spmdnet.tensor`` is the factory function.)

This module knows no op by name: ``spmdnet.ops.bind_tensor_methods()``
(called by ``spmdnet/__init__.py``) binds the operators and methods (``+``,
``@``, ``.sum()`` ...) onto Tensor from one explicit table.

The default floating dtype lives here too: it decides what tensors built from
Python lists and new parameters hold.
"""
import numpy as np

from . import host_memory
from ._tensor_str import tensor_repr
from ._device import device_of_array
from .dtypes import is_floating
from ._owned_storage import owner_of
from .backend import asnumpy, is_cupy_array

_default_dtype = [np.dtype(np.float32)]

# The host allocator policy (host_memory.py) changes the whole process, so
# the first tensor applies it, not ``import spmdnet``; one global read per
# tensor after that.
_host_policy_pending = True


def _apply_host_policy():
    global _host_policy_pending
    host_memory.retain_freed_memory()
    _host_policy_pending = False


def set_default_dtype(dtype):
    """Set the floating dtype given to Python lists/scalars and new parameters."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise TypeError(f"default dtype must be floating point, got {dtype}")
    _default_dtype[0] = dtype


def get_default_dtype():
    """The floating dtype for new parameters and tensors built from lists."""
    return _default_dtype[0]


def _can_require_grad(dtype):
    """Floating (bfloat16 included) and complex dtypes carry gradients, as in PyTorch."""
    return dtype.kind == "c" or is_floating(dtype)


def _refuse_non_numeric(data, arr):
    """A tensor holds numbers or bools: str, bytes, dicts, sets, None and other
    objects raise TypeError, as PyTorch's constructors do."""
    if arr.dtype.kind not in "biufc":
        kind = type(data).__name__
        if isinstance(data, (str, bytes)):
            raise TypeError(f"new(): invalid data type '{kind}'")
        raise TypeError(f"cannot make a tensor of {kind} data (NumPy reads it as "
                        f"{arr.dtype}): a tensor holds numbers or bools")


def _as_array(x, dtype=None):
    """An ndarray for x; arrays (and NumPy scalars, as in PyTorch) keep their
    dtype, Python lists/scalars take the default."""
    if isinstance(x, Tensor):
        x = x.array
    if isinstance(x, np.generic):
        x = np.asarray(x)
    if isinstance(x, np.ndarray) or is_cupy_array(x):
        return x if dtype is None else x.astype(dtype, copy=False)
    arr = np.asarray(x)
    _refuse_non_numeric(x, arr)
    if dtype is None and arr.dtype.kind == "f":
        dtype = get_default_dtype()
    elif dtype is None and arr.dtype.kind == "c":  # PyTorch: complex64 beside float32
        dtype = np.result_type(get_default_dtype(), np.complex64)
    return arr if dtype is None else arr.astype(dtype, copy=False)


# ``Tensor.backward`` runs the engine: spmdnet.autograd.engine builds on Tensor
# and registers its ``backward`` here when it loads (``import spmdnet`` loads
# it), so this module imports nothing above it, as torch.Tensor.backward calls
# torch.autograd.backward.
BACKWARD_ENGINE = [None]


class Tensor:
    """An array with an optional gradient and the graph that produced it."""

    # ``array`` is the NumPy or CuPy array itself; ``data`` (below) is
    # PyTorch's detached Tensor over it. What a parallel wrapper needs of a
    # tensor lives outside it: where its gradient goes (autograd's
    # ``grad_placement``), who owns its storage (``_owned_storage``).
    __slots__ = ("array", "_grad", "_requires_grad", "_ctx", "_hooks",
                 "_post_hooks", "_retain", "__weakref__")
    __array_priority__ = 1000  # ndarray OP Tensor defers to Tensor's reflected op

    def __init__(self, data, requires_grad=False):
        if _host_policy_pending:
            _apply_host_policy()
        self.array = _as_array(data)
        self._grad = None
        self._ctx = None
        self._hooks = None
        self._post_hooks = None
        self._retain = False
        self._requires_grad = False
        self.requires_grad = requires_grad

    # -- attributes ------------------------------------------------------------
    @property
    def grad(self):
        """The accumulated gradient: a Tensor (its ``.array`` the array), or None."""
        return self._grad

    @grad.setter
    def grad(self, value):
        """Accepts None, a Tensor or an array (wrapped without a copy); the
        shape and dtype must match the tensor's, as PyTorch checks."""
        if value is not None:
            if not isinstance(value, Tensor):
                value = Tensor(value)
            if value.array.shape != self.array.shape:
                raise RuntimeError(f"assigned grad has data of a different size: "
                                   f"{value.array.shape} != {self.array.shape}")
            if value.array.dtype != self.array.dtype:
                raise RuntimeError(f"assigned grad has data of a different type: "
                                   f"{value.array.dtype} != {self.array.dtype}")
        self._grad = value

    @property
    def data(self):
        """PyTorch's ``.data``: a new Tensor over the same array, outside any
        graph (requires_grad False), so ``p.data.normal_()``, ``p.data.add_()``
        or ``p.data[0] = v`` write this tensor's memory. (The array itself is
        ``.array``.)"""
        return Tensor(self.array)

    @data.setter
    def data(self, value):
        """``p.data = t`` rebinds this tensor to ``t``'s array (any shape or
        floating dtype, as PyTorch; ``.grad`` and ``requires_grad`` are kept).
        A Tensor or a NumPy/CuPy array (PyTorch takes only a Tensor). Refused
        when a wrapper owns the storage (FSDP's or ZeRO's flat buffer): the
        wrapper would go on reading and writing the old one."""
        array = value.array if isinstance(value, Tensor) else value
        if array is self.array:
            return  # p.data *= c: the in-place op already wrote; nothing to rebind
        owner = owner_of(self)
        if owner is not None:
            raise RuntimeError(f"cannot rebind .data of {owner}: the wrapper owns its "
                               "storage (a view into its flat buffer) and would go on using "
                               "the old array; change the values in place (p.data.copy_(t)) "
                               "or through the wrapper's load_state_dict")
        if not (isinstance(array, np.ndarray) or is_cupy_array(array)):
            raise TypeError(f"Variable data has to be a tensor, but got {type(value).__name__}")
        if self._requires_grad and not _can_require_grad(array.dtype):
            raise RuntimeError(f"data set to a tensor that requires gradients must be floating "
                               f"point or complex dtype, got {array.dtype}")
        self.array = array

    @property
    def requires_grad(self):
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag):
        if flag and not _can_require_grad(self.array.dtype):
            raise TypeError("only floating point tensors can require gradients, "
                            f"got dtype {self.array.dtype}")
        self._requires_grad = bool(flag)

    shape = property(lambda self: self.array.shape)
    dtype = property(lambda self: self.array.dtype)
    ndim = property(lambda self: self.array.ndim)
    device = property(lambda self: device_of_array(self.array))  # a spmdnet.device
    is_leaf = property(lambda self: self._ctx is None)
    grad_fn = property(lambda self: self._ctx)  # the Function that made it, or None
    is_cuda = property(lambda self: is_cupy_array(self.array))

    def size(self, dim=None):
        """The shape (a tuple), or the length of dim ``dim``, as PyTorch
        (the element count is ``numel()``)."""
        if dim is None:
            return self.array.shape
        ndim = self.array.ndim
        if not -ndim <= dim < ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of "
                             f"[{-ndim}, {ndim - 1}], but got {dim})" if ndim else
                             f"dimension specified as {dim} but tensor has no dimensions")
        return self.array.shape[dim]

    def numel(self):
        """The number of elements."""
        return int(self.array.size)

    nelement = numel

    def dim(self):
        """The number of dims (``ndim``)."""
        return self.array.ndim

    def element_size(self):
        return self.array.dtype.itemsize

    nbytes = property(lambda self: self.array.nbytes)  # PyTorch's Tensor.nbytes, itemsize
    itemsize = property(lambda self: self.array.dtype.itemsize)

    def __len__(self):
        return len(self.array)

    def __repr__(self):
        """PyTorch's text: ``tensor([0.5000, 1.0000], requires_grad=True)``
        (``_tensor_str.py``)."""
        return tensor_repr(self, get_default_dtype())

    def __format__(self, spec):
        """``f"{loss:.4f}"``: a 0-dim tensor formats as its Python scalar; any
        other takes only an empty spec (TypeError otherwise), as PyTorch."""
        if self.array.ndim == 0:
            return format(self.item(), spec)
        return object.__format__(self, spec)

    def __index__(self):
        """A single-element integer (or bool) tensor as a list index or slice
        bound (``classes[labels[j]]``), as PyTorch."""
        if self.array.size != 1 or self.array.dtype.kind not in "biu":
            raise TypeError("only integer tensors of a single element can be converted to "
                            f"an index (got dtype {self.array.dtype}, shape {self.shape})")
        return int(self.array.reshape(()).item())

    def __bool__(self):
        if self.array.size != 1:
            raise RuntimeError(f"Boolean value of Tensor with more than one value is "
                               f"ambiguous (shape {self.shape})")
        return bool(self.array)

    __hash__ = object.__hash__  # identity, so tensors can key dicts and sets

    # -- conversions -------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        """``np.asarray(t)``: the host array, as PyTorch's (which raises for
        a tensor that requires grad and for a GPU tensor; so does this)."""
        if self._requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. "
                               "Use tensor.detach().numpy() instead.")
        if is_cupy_array(self.array):
            raise TypeError("can't convert a gpu tensor to numpy: use .numpy() or .cpu() "
                            "to copy it to host memory first")
        arr = self.array if dtype is None else self.array.astype(dtype, copy=False)
        return arr.copy() if copy else arr

    def numpy(self):
        """A host NumPy copy of the data (never shares memory with the tensor)."""
        return np.array(asnumpy(self.array), copy=True)

    def item(self):
        """The single element as a Python scalar."""
        if self.array.size != 1:
            raise RuntimeError(f"a Tensor with {self.array.size} elements cannot be converted "
                               f"to Scalar (item() needs exactly one; shape {self.shape})")
        return self.array.reshape(()).item()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def tolist(self):
        return self.numpy().tolist()

    def detach(self):
        """A tensor sharing this array, outside any graph."""
        return Tensor(self.array)

    def astype(self, dtype):
        """A copy cast to ``dtype``, outside the graph (use for labels, masks)."""
        return Tensor(self.array.astype(dtype))

    # -- hooks -------------------------------------------------------------------
    def register_hook(self, fn):
        """Run ``fn(grad)`` (a Tensor) when this tensor's gradient is known; a
        non-None return value (a Tensor or an array) replaces the gradient."""
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that does not require grad")
        self._hooks = (self._hooks or []) + [fn]
        return _HookHandle(self, "_hooks", fn)

    def register_post_accumulate_grad_hook(self, fn):
        """Run ``fn(self)`` on a leaf right after its ``.grad`` is final."""
        if self._ctx is not None:
            raise RuntimeError("post-accumulate-grad hooks are for leaf tensors only")
        self._post_hooks = (self._post_hooks or []) + [fn]
        return _HookHandle(self, "_post_hooks", fn)

    def retain_grad(self):
        """Keep ``.grad`` on a non-leaf tensor after backward."""
        self._retain = True

    def backward(self, grad=None, retain_graph=False):
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``."""
        BACKWARD_ENGINE[0](self, grad, retain_graph)


class _HookHandle:
    """Returned by the register_* methods; ``remove()`` unregisters."""

    def __init__(self, tensor, slot, fn):
        self.tensor, self.slot, self.fn = tensor, slot, fn

    def remove(self):
        hooks = getattr(self.tensor, self.slot) or []
        setattr(self.tensor, self.slot, [h for h in hooks if h is not self.fn] or None)

