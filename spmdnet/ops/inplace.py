"""In-place methods (PyTorch's trailing-underscore methods, augmented
assignment and ``t[i] = v``): they change ``.array`` where it lives and return
the tensor, so a gradient whose ``.array`` is a view into a flat buffer
(DataParallel's buckets) stays one: ``p.grad *= c`` scales the bucket.

They record no graph. As PyTorch, a leaf that requires grad may change in
place only inside ``no_grad()`` (the manual-SGD idiom ``p -= lr * p.grad``).
An in-place op that PyTorch would record (on a non-leaf that requires grad,
or with an operand that does) is not done in place here (docs/PYTORCH.md
lists the difference): ``+=``, ``-=``, ``*=`` and ``/=`` fall back to the
out-of-place op, which rebinds the name; the methods raise RuntimeError.
"""
import operator

from .._tensor import Tensor
from ..autograd import is_grad_enabled
from ..backend import device_of, to_device, xp_of
from .index import unwrap_index


def _value(other):
    return other.array if isinstance(other, Tensor) else other


def _in_graph(t, name, other=None):
    """True when the op would have to be recorded (``t`` is a non-leaf of a
    graph, or ``other`` requires grad); raise for a leaf that requires grad
    outside ``no_grad()`` (PyTorch's error)."""
    if not is_grad_enabled():
        return False
    if t._requires_grad and t._ctx is None:
        raise RuntimeError(f"a leaf Variable that requires grad is being used in an in-place "
                           f"operation ({name}); do it inside spmdnet.no_grad()")
    return t._requires_grad or (isinstance(other, Tensor) and other._requires_grad)


def _no_graph(t, name, other=None):
    if _in_graph(t, name, other):
        raise RuntimeError(f"{name}: in-place operations on a tensor that is part of an "
                           "autograd graph are not supported; use the out-of-place op")


def _augmented(name, fallback, update):
    """``__iadd__`` & co.: in place on ``.array``, out of place inside a graph."""
    def method(self, other):
        if _in_graph(self, name, other):
            return fallback(self, other)
        update(self.array, _value(other))
        return self
    method.__name__ = name
    return method


iadd = _augmented("__iadd__", lambda a, b: a + b, operator.iadd)
isub = _augmented("__isub__", lambda a, b: a - b, operator.isub)
imul = _augmented("__imul__", lambda a, b: a * b, operator.imul)
itruediv = _augmented("__itruediv__", lambda a, b: a / b, operator.itruediv)


def add_(self, other, *, alpha=1):
    """``self += alpha * other`` in place."""
    _no_graph(self, "add_", other)
    other = _value(other)
    self.array += other if alpha == 1 else other * alpha
    return self


def sub_(self, other, *, alpha=1):
    """``self -= alpha * other`` in place."""
    _no_graph(self, "sub_", other)
    other = _value(other)
    self.array -= other if alpha == 1 else other * alpha
    return self


def mul_(self, other):
    _no_graph(self, "mul_", other)
    self.array *= _value(other)
    return self


def div_(self, other):
    _no_graph(self, "div_", other)
    self.array /= _value(other)
    return self


def zero_(self):
    _no_graph(self, "zero_")
    self.array.fill(0)
    return self


def fill_(self, value):
    _no_graph(self, "fill_", value)
    self.array.fill(_value(value))
    return self


def clamp_(self, min=None, max=None):  # noqa: A002 - PyTorch's argument names
    """Clip to [min, max] in place (either None; scalars or tensors), written
    through ``out=`` so views of this array see it (``p.data.clamp_(-c, c)``)."""
    _no_graph(self, "clamp_", min if isinstance(min, Tensor) else max)
    if min is None and max is None:
        raise RuntimeError("clamp_: at least one of 'min' or 'max' must not be None")
    xp_of(self.array).clip(self.array, _value(min), _value(max), out=self.array)
    return self


def relu_(self):
    """``max(x, 0)`` in place (``torch.relu_``, ``Tensor.relu_``): negatives
    become 0 where they are, NaN and -0.0 stay, as ``relu``'s."""
    _no_graph(self, "relu_")
    xp_of(self.array).copyto(self.array, self.array.dtype.type(0), where=self.array < 0)
    return self


def copy_(self, src, non_blocking=False):
    """Copy ``src`` (a Tensor or an array, any device, cast to this dtype)
    into this tensor's data; ``non_blocking`` is accepted for PyTorch's
    signature."""
    _no_graph(self, "copy_", src)
    self.array[...] = to_device(_value(src), device_of(self.array))
    return self


def setitem(self, index, value):
    """``t[index] = value`` in place (index parts may be Tensors)."""
    _no_graph(self, "__setitem__", value)
    index = unwrap_index(index, self.array)
    value = _value(value)
    if hasattr(value, "shape"):
        value = to_device(value, device_of(self.array))
    self.array[index] = value
    return None


METHODS = {
    "__iadd__": iadd, "__isub__": isub, "__imul__": imul, "__itruediv__": itruediv,
    "add_": add_, "sub_": sub_, "mul_": mul_, "div_": div_, "zero_": zero_, "fill_": fill_,
    "clamp_": clamp_, "clip_": clamp_, "relu_": relu_, "copy_": copy_, "__setitem__": setitem,
}
