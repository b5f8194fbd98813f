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
from .backend import asnumpy, device_of, is_cupy_array

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


def _as_array(x, dtype=None):
    """An ndarray for x; arrays (and NumPy scalars, as in PyTorch) keep their
    dtype, Python lists/scalars take the default."""
    if isinstance(x, Tensor):
        x = x.data
    if isinstance(x, np.generic):
        x = np.asarray(x)
    if isinstance(x, np.ndarray) or is_cupy_array(x):
        return x if dtype is None else x.astype(dtype, copy=False)
    arr = np.asarray(x)
    if dtype is None and arr.dtype.kind == "f":
        dtype = get_default_dtype()
    return arr if dtype is None else arr.astype(dtype, copy=False)


class Tensor:
    """An array with an optional gradient and the graph that produced it."""

    __slots__ = ("data", "_grad", "grad_buffer", "_requires_grad", "_ctx", "_hooks",
                 "_post_hooks", "_retain", "__weakref__")
    __array_priority__ = 1000  # ndarray OP Tensor defers to Tensor's reflected op

    def __init__(self, data, requires_grad=False):
        if _host_policy_pending:
            _apply_host_policy()
        self.data = _as_array(data)
        self._grad = None
        # Preallocated home of this leaf's gradient: a Tensor whose .data is
        # a view into a flat buffer (data parallelism's buckets). When .grad
        # is None, backward writes the gradient into it (through ``out=``
        # where the op supports it) and makes this same Tensor the .grad.
        self.grad_buffer = None
        self._ctx = None
        self._hooks = None
        self._post_hooks = None
        self._retain = False
        self._requires_grad = False
        self.requires_grad = requires_grad

    # -- attributes ------------------------------------------------------------
    @property
    def grad(self):
        """The accumulated gradient: a Tensor (its ``.data`` the array), or None."""
        return self._grad

    @grad.setter
    def grad(self, value):
        """Accepts None, a Tensor or an array (wrapped without a copy); the
        shape and dtype must match the tensor's, as PyTorch checks."""
        if value is not None:
            if not isinstance(value, Tensor):
                value = Tensor(value)
            if value.data.shape != self.data.shape:
                raise RuntimeError(f"assigned grad has data of a different size: "
                                   f"{value.data.shape} != {self.data.shape}")
            if value.data.dtype != self.data.dtype:
                raise RuntimeError(f"assigned grad has data of a different type: "
                                   f"{value.data.dtype} != {self.data.dtype}")
        self._grad = value

    @property
    def requires_grad(self):
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag):
        if flag and self.data.dtype.kind not in "fc":
            raise TypeError("only floating point tensors can require gradients, "
                            f"got dtype {self.data.dtype}")
        self._requires_grad = bool(flag)

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    device = property(lambda self: device_of(self.data))
    is_leaf = property(lambda self: self._ctx is None)
    is_cuda = property(lambda self: is_cupy_array(self.data))

    def size(self, dim=None):
        """The shape (a tuple), or the length of dim ``dim``, as PyTorch
        (the element count is ``numel()``)."""
        if dim is None:
            return self.data.shape
        ndim = self.data.ndim
        if not -ndim <= dim < ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of "
                             f"[{-ndim}, {ndim - 1}], but got {dim})" if ndim else
                             f"dimension specified as {dim} but tensor has no dimensions")
        return self.data.shape[dim]

    def numel(self):
        """The number of elements."""
        return int(self.data.size)

    nelement = numel

    def dim(self):
        """The number of dims (``ndim``)."""
        return self.data.ndim

    def element_size(self):
        return self.data.dtype.itemsize

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({self.data!r}{grad})"

    def __bool__(self):
        if self.data.size != 1:
            raise RuntimeError(f"Boolean value of Tensor with more than one value is "
                               f"ambiguous (shape {self.shape})")
        return bool(self.data)

    __hash__ = object.__hash__  # identity, so tensors can key dicts and sets

    # -- conversions -------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        """``np.asarray(t)``: the host array, as PyTorch's (which raises for
        a tensor that requires grad and for a GPU tensor; so does this)."""
        if self._requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. "
                               "Use tensor.detach().numpy() instead.")
        if is_cupy_array(self.data):
            raise TypeError("can't convert a gpu tensor to numpy: use .numpy() or .cpu() "
                            "to copy it to host memory first")
        arr = self.data if dtype is None else self.data.astype(dtype, copy=False)
        return arr.copy() if copy else arr

    def numpy(self):
        """A host NumPy copy of the data (never shares memory with the tensor)."""
        return np.array(asnumpy(self.data), copy=True)

    def item(self):
        """The single element as a Python scalar."""
        if self.data.size != 1:
            raise RuntimeError(f"a Tensor with {self.data.size} elements cannot be converted "
                               f"to Scalar (item() needs exactly one; shape {self.shape})")
        return self.data.reshape(()).item()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def tolist(self):
        return self.numpy().tolist()

    def detach(self):
        """A tensor sharing this data, outside any graph."""
        return Tensor(self.data)

    def astype(self, dtype):
        """A copy cast to ``dtype``, outside the graph (use for labels, masks)."""
        return Tensor(self.data.astype(dtype))

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
        # spmdnet.autograd builds on Tensor (Function wraps outputs in Tensors):
        # the one upward reference, so the one import that waits for its call.
        from .autograd.engine import backward  # noqa: PLC0415 - autograd imports this module
        backward(self, grad, retain_graph)


class _HookHandle:
    """Returned by the register_* methods; ``remove()`` unregisters."""

    def __init__(self, tensor, slot, fn):
        self.tensor, self.slot, self.fn = tensor, slot, fn

    def remove(self):
        hooks = getattr(self.tensor, self.slot) or []
        setattr(self.tensor, self.slot, [h for h in hooks if h is not self.fn] or None)

