"""What a ``torch.save`` file may name when loaded: PyTorch's globals
mapped onto spmdnet's (the rebuild functions, storage kinds, dtypes,
``torch.Size``, ``torch.device``, ``OrderedDict``...), which of them may
be called, the checks on their arguments, and the globals a user admits
(``add_safe_globals``, ``safe_globals``: PyTorch's API).

Every rebuild function checks the types, ranges and layout of what it is
given before it builds anything and raises ``_unpickler.Refused`` with the
reason, so a corrupt or hostile file cannot reach memory outside a storage,
make a string or object tensor, or make a call walk an enormous structure.
"""
import collections
import threading
import warnings

import numpy as np

from .. import backend
from .._device import device as Device
from .._tensor import Tensor
from ..nn.parameter import Parameter
from . import _format
from ._unpickler import Refused, describe

MAX_DIMS = 64  # NumPy's limit


class StorageType:
    """``torch.<Kind>Storage`` read from a file: which element type it holds.
    Shared by every load, so it cannot be changed."""

    __slots__ = ("name", "dtype_name")

    def __init__(self, name):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "dtype_name", _format.DTYPE_OF_STORAGE[name])

    def __setattr__(self, name, value):
        raise AttributeError(f"torch.{self.name} read from files is immutable")

    __delattr__ = __setattr__


def _whole(value, what):
    if type(value) is not int:
        raise Refused(f"{what} is {describe(value)}, not an int")
    return value


def _dims(values, what):
    if type(values) not in (tuple, list) or len(values) > MAX_DIMS:
        raise Refused(f"{what} is {describe(values)}, not a tuple of at most {MAX_DIMS} ints")
    return tuple(_whole(n, what) for n in values)


def _flag(value, what):
    if type(value) not in (bool, int):
        raise Refused(f"{what} is {describe(value)}, not a bool")
    return bool(value)


def _no_hooks(hooks):
    if hooks is not None and (not isinstance(hooks, dict) or hooks):
        raise Refused(f"backward hooks in a file ({describe(hooks)}) are not restored")


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
    """A Tensor viewing ``storage`` (offset and strides in elements); the
    layout is checked against the storage first, so a corrupt file cannot
    reach memory outside it."""
    if not isinstance(storage, np.ndarray) and not backend.is_cupy_array(storage):
        raise Refused(f"_rebuild_tensor_v2 expects a storage, got {describe(storage)}")
    size, stride = _dims(size, "a tensor's size"), _dims(stride, "a tensor's stride")
    offset = _whole(storage_offset, "a tensor's storage offset")
    requires_grad = _flag(requires_grad, "requires_grad")
    _no_hooks(backward_hooks)
    if metadata is not None and not isinstance(metadata, dict):
        raise Refused(f"tensor metadata is {describe(metadata)}, not a dict")
    if len(size) != len(stride) or any(n < 0 for n in size + stride) or offset < 0:
        raise Refused(f"bad tensor layout in file: offset {offset}, size {size[:8]}, "
                      f"stride {stride[:8]}")
    item = storage.dtype.itemsize
    if 0 not in size:
        last = offset + sum((n - 1) * st for n, st in zip(size, stride))
        if last >= storage.size:
            raise Refused(f"tensor of size {size}, stride {stride}, offset {offset} does not "
                          f"fit its storage of {storage.size} elements")
    elif any(n * item >= 1 << 62 for n in size + stride):
        raise Refused(f"empty tensor of size {size} or stride {stride}: too large")
    if backend.is_cupy_array(storage):  # CuPy's as_strided trusts its arguments: checked above
        xp = backend.require_cupy()
        start = min(offset, storage.size)
        array = xp.lib.stride_tricks.as_strided(storage[start:], size,
                                                tuple(s * item for s in stride))
    else:
        array = np.ndarray(size, storage.dtype, buffer=storage,
                           offset=min(offset, storage.size) * item,
                           strides=tuple(s * item for s in stride))
    return Tensor(array, requires_grad=requires_grad)


def _rebuild_tensor(storage, storage_offset, size, stride):
    return _rebuild_tensor_v2(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad, backward_hooks=None):
    if not isinstance(data, Tensor):
        raise Refused(f"_rebuild_parameter expects a tensor, got {describe(data)}")
    _no_hooks(backward_hooks)
    return Parameter(data.array, requires_grad=_flag(requires_grad, "requires_grad"))


def _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state):
    warn_dropped_state(state, "Parameter")
    return _rebuild_parameter(data, requires_grad, backward_hooks)


def warn_dropped_state(state, what):
    """PyTorch keeps a tensor's Python attributes; spmdnet's tensors have
    none (``__slots__``), so they are dropped, and said so."""
    if state is None or (type(state) is dict and not state):
        return
    if type(state) is not dict:
        raise Refused(f"a {what}'s state is {describe(state)}, not a dict of attributes")
    names = ", ".join(describe(k) for k in list(state)[:5])
    warnings.warn(f"a {what} in the file carries Python attributes ({names}) that spmdnet "
                  "tensors cannot hold: they are dropped", UserWarning, stacklevel=2)


def _rebuild_from_type_v2(func, new_type, args, state):
    """PyTorch's wrapper for tensor subclasses (``weights_only=False``; the
    weights-only reader checks ``func`` first): only Tensor and Parameter."""
    out = func(*args)
    if new_type is Parameter and not isinstance(out, Parameter):
        out = Parameter(out.array, requires_grad=out.requires_grad)
    return out


def _size(dims=()):
    """``torch.Size`` -> a tuple (spmdnet's shapes are tuples)."""
    return _dims(dims, "torch.Size's argument")


def _encode(text, encoding="latin1"):
    """``_codecs.encode``: how pickle protocol 2 writes bytes."""
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise Refused(f"_codecs.encode({describe(text)}, {describe(encoding)}) is not bytes")
    return text.encode("latin1")


def _allowed_globals():
    table = {("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
             ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
             ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
             ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter_with_state,
             ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
             ("torch", "Tensor"): Tensor, ("torch.nn.parameter", "Parameter"): Parameter,
             ("torch", "Size"): _size, ("torch", "device"): Device,
             ("collections", "OrderedDict"): collections.OrderedDict,
             ("_codecs", "encode"): _encode}
    for builtins in ("builtins", "__builtin__"):
        table.update({(builtins, "set"): set, (builtins, "frozenset"): frozenset,
                      (builtins, "complex"): complex})
    for name in _format.DTYPE_OF_STORAGE:
        table[("torch", name)] = StorageType(name)
    for torch_name, name in _format.DTYPE_OF_TORCH_NAME.items():
        table[("torch", torch_name)] = _format.numpy_dtype(name)
    return table


ALLOWED = _allowed_globals()
REBUILDERS = {id(f) for f in (_rebuild_tensor_v2, _rebuild_tensor, _rebuild_parameter,
                              _rebuild_parameter_with_state)}
# what a weights-only file may call (by identity); Tensor, Parameter, storage
# kinds and dtypes are values only: a file never calls Tensor(...) itself
CALLABLE = REBUILDERS | {id(f) for f in (_rebuild_from_type_v2, _size, _encode, Device,
                                         collections.OrderedDict, set, frozenset, complex)}


def _items(args, what):
    if len(args) > 1:
        raise Refused(f"{what} takes at most one argument, got {len(args)}")
    if not args:
        return []
    source = args[0]
    if not isinstance(source, (list, tuple, set, frozenset, dict)):
        raise Refused(f"{what}'s argument is {describe(source)}, not a container")
    return list(source.items() if isinstance(source, dict) else source)


def checked_call(func, args, check_key):
    """Call an admitted function of this module or builtin type, its
    arguments checked first (the rebuild functions check their own)."""
    if func in (set, frozenset):
        return func(check_key(item) for item in _items(args, func.__name__))
    if func is collections.OrderedDict:
        pairs = _items(args, "OrderedDict")
        if any(type(pair) not in (tuple, list) or len(pair) != 2 for pair in pairs):
            raise Refused("OrderedDict's argument is not a sequence of (key, value) pairs")
        return collections.OrderedDict((check_key(k), v) for k, v in pairs)
    if func is complex:
        if len(args) > 2 or any(type(a) not in (int, float, complex) and not (
                type(a) is str and len(a) < 100) for a in args):
            raise Refused("complex() takes up to two numbers")
        return complex(*args)
    if func is Device:
        name, index = (*args, None)[:2] if args else (None, None)
        if not 1 <= len(args) <= 2 or not ((type(name) is str and len(name) <= 64)
                                           or type(name) is int) \
                or not (index is None or type(index) is int):
            raise Refused(f"torch.device takes a name and an index, got "
                          f"{', '.join(describe(a) for a in args[:3])}")
        return Device(*args)
    return func(*args)


# -- the globals a user admits: PyTorch's add_safe_globals API -------------------
_user_allowed = {}  # (module, name) -> object
_lock = threading.Lock()


def user_allowed():
    """A snapshot of the admitted globals (a load sees those of its start)."""
    with _lock:
        return dict(_user_allowed)


def _global_names(entry):
    """The (module, name) pairs under which a file may name ``entry``: its
    own, and for a spmdnet class at PyTorch's path (``spmdnet.nn.modules.linear``)
    PyTorch's spelling too (``torch.nn.modules.linear``), so a whole module that
    PyTorch pickled loads into the spmdnet class the user admitted."""
    if isinstance(entry, tuple):
        obj, dotted = entry
        module, _, name = dotted.rpartition(".")
        return {(module, name): obj}
    module, name = entry.__module__, entry.__qualname__
    names = {(module, name): entry}
    if module.startswith("spmdnet."):
        names[("torch" + module[len("spmdnet"):], name)] = entry
    return names


def _admitted(safe_globals):
    entries = {}
    for entry in safe_globals:
        entries.update(_global_names(entry))
    return entries


def add_safe_globals(safe_globals):
    """PyTorch's ``torch.serialization.add_safe_globals``: admit these globals
    (classes or functions, or ``(object, "module.name")`` pairs) in
    ``weights_only=True`` loads of this process: the file may call them and
    set the state of the objects they create. Whatever they do, you vouch for."""
    entries = _admitted(safe_globals)
    with _lock:
        _user_allowed.update(entries)


def get_safe_globals():
    with _lock:  # each admitted object once, though it may be named two ways
        return list({id(obj): obj for obj in _user_allowed.values()}.values())


def clear_safe_globals():
    with _lock:
        _user_allowed.clear()


class safe_globals:  # noqa: N801 - PyTorch's name
    """``with safe_globals([...]):`` admits the globals inside the block only."""

    def __init__(self, safe_globals):
        self._entries = _admitted(safe_globals)

    def __enter__(self):
        with _lock:
            self._before = dict(_user_allowed)
            _user_allowed.update(self._entries)
        return self

    def __exit__(self, *exc):
        with _lock:
            _user_allowed.clear()
            _user_allowed.update(self._before)
        return False
