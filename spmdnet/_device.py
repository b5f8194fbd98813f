"""PyTorch's ``torch.device``: ``device("cpu")``, ``device("cuda:1")``,
``device("cuda", 1)``, ``device(1)``, with ``.type`` and ``.index``, and
``with device("cuda"):`` as the default device of tensor creation.

A leaf (it imports only ``backend`` and ``_meta``, the meta device's arrays,
which it re-exports): ``Tensor.device`` and the argument parser
(``_args.resolve_device``) both build on it.

Intentional differences: a device is a ``str`` subclass whose text is
PyTorch's ``str(device)``, and it equals the strings naming it
(``device("cpu") == "cpu"``; PyTorch answers False); a CUDA device also
equals spmdnet's internal name ``"gpu"``. So every place that takes a device
name (``Module.to``, ``Tensor.to``, the creation functions) takes a device,
and code written against the old string ``Tensor.device`` keeps working.
"""
import threading

from ._meta import MetaArray, is_meta_array, meta_array
from .backend import is_cupy_array

KNOWN_TYPES = ("cpu", "cuda", "mps", "meta", "xpu")
_default = threading.local()  # .stack: devices of the open `with device(...)` blocks


def _parse(name):
    """(type, index) of ``"cpu"``, ``"cuda"``, ``"cuda:N"``; ValueError otherwise."""
    kind, sep, index = name.partition(":")
    if kind == "gpu":  # spmdnet's internal name of this rank's GPU
        kind = "cuda"
    if kind not in KNOWN_TYPES:
        raise ValueError(f"device type must be one of {', '.join(KNOWN_TYPES)} "
                         f"(optionally ':N'), got {name!r}")
    if not sep:
        return kind, None
    if not index.isdigit():
        raise ValueError(f"invalid device string {name!r}: the index after ':' must be "
                         "a non-negative integer")
    return kind, int(index)


class device(str):  # noqa: N801 - PyTorch's name
    """A device: ``.type`` (``"cpu"``, ``"cuda"``...) and ``.index`` (None,
    or the CUDA ordinal). Immutable and hashable like PyTorch's.

    It is also the string PyTorch prints for it (``str(device("cuda", 1))``
    is ``"cuda:1"``): code that takes device names as strings (``to("cpu")``,
    ``Module.to``, ``device in ("cpu", "gpu")``) takes a device unchanged."""

    def __new__(cls, type, index=None):  # noqa: A002 - PyTorch's argument name
        if isinstance(type, device):
            kind, parsed = type.type, type.index
        elif isinstance(type, int) and not isinstance(type, bool):
            kind, parsed = "cuda", type  # torch.device(1): the accelerator's ordinal
        elif isinstance(type, str):
            kind, parsed = _parse(type)
        else:
            raise TypeError(f"device() takes a string, an int or a device, got {type!r}")
        if index is not None:
            if parsed is not None:
                raise ValueError(f"device {type!r} already names an index; "
                                 f"do not pass index={index!r} too")
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise ValueError(f"device index must be a non-negative int, got {index!r}")
            parsed = index
        if kind == "cpu" and parsed not in (None, 0):
            raise ValueError(f"a cpu device has no index other than 0, got {parsed}")
        self = super().__new__(cls, kind if parsed is None else f"{kind}:{parsed}")
        self.__dict__.update(_type=kind, _index=parsed)
        return self

    def __setattr__(self, name, value):
        raise AttributeError(f"device is immutable: cannot set {name!r}")

    type = property(lambda self: self._type)
    index = property(lambda self: self._index)

    def __str__(self):
        return str.__str__(self)

    def __repr__(self):
        if self._index is None:
            return f"device(type='{self._type}')"
        return f"device(type='{self._type}', index={self._index})"

    def __eq__(self, other):
        if isinstance(other, device):
            return (self._type, self._index) == (other._type, other._index)
        if isinstance(other, str):
            if other == "gpu":
                return self._type == "cuda"
            try:
                return (self._type, self._index) == _parse(other)
            except ValueError:
                return False
        return NotImplemented

    def __ne__(self, other):  # str's own __ne__ would compare the text only
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self):
        return str.__hash__(self)  # as the string it equals

    def __reduce__(self):
        return (device, (str(self),))

    def __enter__(self):
        """Make this the device that creation functions use when given none."""
        stack = getattr(_default, "stack", None)
        if stack is None:
            stack = _default.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc):
        _default.stack.pop()
        return False


CPU = device("cpu")
META = device("meta")


def default_device():
    """The device of the innermost open ``with device(...)`` block (or set by
    ``set_default_device``), or None: creation functions then use the CPU."""
    stack = getattr(_default, "stack", None)
    return stack[-1] if stack else getattr(_default, "fixed", None)


def set_default_device(dev):
    """PyTorch's ``torch.set_default_device``: None restores the CPU."""
    _default.fixed = None if dev is None else device(dev)


def get_default_device():
    """PyTorch's ``torch.get_default_device``."""
    return default_device() or CPU


def device_of_array(a):
    """The ``device`` an array lives on: its CUDA ordinal for a CuPy array."""
    if is_cupy_array(a):
        return device("cuda", int(a.device.id))
    if isinstance(a, MetaArray):
        return META
    return CPU


def builds_on_meta():
    """Whether an open ``with device("meta")`` (or ``set_default_device``)
    makes new parameters and buffers meta, as PyTorch's module constructors
    under a meta default device."""
    dev = default_device()
    return dev is not None and dev.type == "meta"


__all__ = ["device", "default_device", "set_default_device", "get_default_device",
           "device_of_array", "builds_on_meta", "MetaArray", "meta_array", "is_meta_array"]
