"""``spmdnet.load``: PyTorch's zip files (``torch.save``) back into spmdnet
objects, without PyTorch and, by default, without running code from the file.

``weights_only=True`` unpickles with an allow-list, as PyTorch's
``weights_only`` loader: tensor and Parameter rebuilding, storages, dtypes,
``torch.Size`` (a tuple here), ``torch.device``, ``OrderedDict``, ``set``,
``frozenset``, ``complex``, bytes and the plain containers pickle builds
without globals. Any other global is refused before it is imported, with
``pickle.UnpicklingError`` naming it. ``weights_only=False`` unpickles as
Python does (it imports and calls what the file names: trusted files only),
mapping PyTorch's globals onto spmdnet's.
"""
import collections
import io
import pickle
import warnings

import numpy as np

from .. import backend
from .._device import device as Device
from .._tensor import Tensor
from ..nn.parameter import Parameter
from . import _format

_said = set()  # one-time notes already given in this process


class _StorageType:
    """``torch.<Kind>Storage`` read from a file: which element type it holds."""

    def __init__(self, name):
        self.name, self.dtype_name = name, _format.DTYPE_OF_STORAGE[name]


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
    """A Tensor viewing ``storage`` (offset and strides in elements); the
    layout is checked against the storage first, so a corrupt file cannot
    reach memory outside it."""
    if not isinstance(storage, (np.ndarray,)) and not backend.is_cupy_array(storage):
        raise pickle.UnpicklingError(f"_rebuild_tensor_v2 expects a storage, got "
                                     f"{type(storage).__name__}")
    size, stride = tuple(int(n) for n in size), tuple(int(n) for n in stride)
    storage_offset = int(storage_offset)
    if len(size) != len(stride) or any(n < 0 for n in size + stride) or storage_offset < 0:
        raise pickle.UnpicklingError(f"bad tensor layout in file: offset {storage_offset}, "
                                     f"size {size}, stride {stride}")
    last = storage_offset + sum((n - 1) * st for n, st in zip(size, stride))
    if 0 not in size and last >= storage.size:
        raise pickle.UnpicklingError(
            f"tensor of size {size}, stride {stride}, offset {storage_offset} does not fit "
            f"its storage of {storage.size} elements")
    item = storage.dtype.itemsize
    if backend.is_cupy_array(storage):  # CuPy's as_strided trusts its arguments: checked above
        xp = backend.require_cupy()
        start = min(int(storage_offset), storage.size)
        array = xp.lib.stride_tricks.as_strided(storage[start:], size,
                                                tuple(s * item for s in stride))
    else:
        array = np.ndarray(size, storage.dtype, buffer=storage,
                           offset=min(int(storage_offset), storage.size) * item,
                           strides=tuple(s * item for s in stride))
    return Tensor(array, requires_grad=bool(requires_grad))


def _rebuild_tensor(storage, storage_offset, size, stride):
    return _rebuild_tensor_v2(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad, backward_hooks=None):
    return Parameter(data.array, requires_grad=bool(requires_grad))


def _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state):
    return _rebuild_parameter(data, requires_grad)


def _rebuild_from_type_v2(func, new_type, args, state):
    """PyTorch's wrapper for tensor subclasses: only Tensor and Parameter here."""
    out = func(*args)
    if new_type is Parameter and not isinstance(out, Parameter):
        out = Parameter(out.array, requires_grad=out.requires_grad)
    return out


def _size(dims=()):
    """``torch.Size`` -> a tuple (spmdnet's shapes are tuples)."""
    return tuple(int(n) for n in dims)


def _encode(text, encoding="latin1"):
    """``_codecs.encode``: how pickle protocol 2 writes bytes."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"_codecs.encode({text!r}, {encoding!r}) is not bytes")
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
        table[("torch", name)] = _StorageType(name)
    for torch_name, name in _format.DTYPE_OF_TORCH_NAME.items():
        table[("torch", torch_name)] = _format.numpy_dtype(name)
    return table


ALLOWED = _allowed_globals()
_user_allowed = {}  # (module, name) -> object: add_safe_globals


def _global_name(entry):
    if isinstance(entry, tuple):
        obj, dotted = entry
        module, _, name = dotted.rpartition(".")
        return (module, name), obj
    return (entry.__module__, entry.__qualname__), entry


def add_safe_globals(safe_globals):
    """PyTorch's ``torch.serialization.add_safe_globals``: admit these globals
    (classes or functions, or ``(object, "module.name")`` pairs) in
    ``weights_only=True`` loads of this process. Whatever they do when the
    file calls them, you vouch for."""
    _user_allowed.update(_global_name(entry) for entry in safe_globals)


def get_safe_globals():
    return list(_user_allowed.values())


def clear_safe_globals():
    _user_allowed.clear()


class safe_globals:  # noqa: N801 - PyTorch's name
    """``with safe_globals([...]):`` admits the globals inside the block only."""

    def __init__(self, safe_globals):
        self._entries = dict(_global_name(entry) for entry in safe_globals)

    def __enter__(self):
        self._before = dict(_user_allowed)
        _user_allowed.update(self._entries)
        return self

    def __exit__(self, *exc):
        _user_allowed.clear()
        _user_allowed.update(self._before)
        return False


class _Unpickler(pickle.Unpickler):
    def __init__(self, data, archive, map_location, weights_only, encoding):
        super().__init__(io.BytesIO(data), encoding=encoding)
        self._archive, self._map, self._weights_only = archive, map_location, weights_only
        self._storages = {}

    def find_class(self, module, name):
        found = ALLOWED.get((module, name), _user_allowed.get((module, name)))
        if found is not None:
            return found
        if self._weights_only:
            raise pickle.UnpicklingError(
                f"Weights only load failed: {self._archive.description}: Unsupported "
                f"global: GLOBAL {module}.{name} is not admitted by spmdnet.load("
                "weights_only=True) (tensors, Parameter, OrderedDict, Size, device, dtypes, "
                "set, frozenset, complex and plain containers). Nothing from the file was "
                "run. If you trust this global, admit it with spmdnet.serialization."
                "add_safe_globals([...]); weights_only=False imports and calls whatever the "
                "file names: use it only for a file you trust.")
        if module == "torch" or module.startswith("torch."):
            raise pickle.UnpicklingError(f"{self._archive.description} names the PyTorch "
                                         f"global {module}.{name}, which spmdnet has no "
                                         "counterpart for")
        return super().find_class(module, name)

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"{self._archive.description}: unknown persistent "
                                         f"id {pid!r} (expected a torch storage)")
        _, kind, key, location, numel = pid
        if key not in self._storages:
            if kind.dtype_name == _format.BFLOAT16 and "bfloat16" not in _said:
                _said.add("bfloat16")
                warnings.warn(f"{self._archive.description} holds bfloat16 tensors: NumPy has "
                              "no bfloat16, so they load as float32 (exactly, every bfloat16 "
                              "is a float32)", UserWarning, stacklevel=3)
            array = self._archive.storage(key, kind.dtype_name, int(numel))
            self._storages[key] = _place(array, str(location), self._map)
        return self._storages[key]


def _place(array, location, map_location):
    """The storage on the device ``map_location`` sends ``location`` to."""
    target = location
    if callable(map_location) and not isinstance(map_location, (str, Device)):
        moved = map_location(array, location)
        return array if moved is None else moved
    if isinstance(map_location, dict):
        target = str(map_location.get(location, location))
    elif map_location is not None:
        target = str(map_location)
    kind = Device(target).type
    if kind == "cpu":
        return array
    if kind == "cuda":
        if not backend.cupy_available():
            raise RuntimeError(
                f"Attempting to deserialize object on a CUDA device ({target}) but "
                "spmdnet.cuda.is_available() is False. Pass map_location='cpu' to load "
                "the tensors into host memory.")
        return backend.require_cupy().asarray(array)
    raise RuntimeError(f"cannot load tensors onto device {target!r}: spmdnet has 'cpu' "
                       "and 'cuda'")


def load(f, map_location=None, pickle_module=None, *, weights_only=True, mmap=None,
         **pickle_load_args):
    """Read what ``torch.save`` (or ``spmdnet.save``) wrote to ``f`` (a path
    or a binary file object). ``map_location``: None (each tensor where it
    was saved), a device or name, a dict of location names, or a callable
    ``(storage, location) -> storage``. ``mmap`` is accepted and ignored:
    storages are read into memory."""
    if pickle_module not in (None, pickle):
        raise ValueError(f"load() reads with Python's pickle; pickle_module="
                         f"{pickle_module!r} is not supported")
    encoding = pickle_load_args.pop("encoding", "utf-8")
    if pickle_load_args:
        raise TypeError(f"load() got unexpected keyword arguments {sorted(pickle_load_args)}")
    stream, description, close = _format.open_source(f)
    try:
        archive = _format.ArchiveReader(stream, description)
        unpickler = _Unpickler(archive.read("data.pkl"), archive, map_location,
                               weights_only, encoding)
        return unpickler.load()
    finally:
        if close:
            stream.close()
