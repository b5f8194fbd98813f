"""``spmdnet.load``: PyTorch's zip files (``torch.save``) back into spmdnet
objects, without PyTorch and, by default, without running code from the file.

``weights_only=True`` reads the pickle with ``_unpickler.SafeUnpickler``, a
Python interpreter of pickle's opcodes, admitting (``_WeightsOnly`` below)
tensor and Parameter rebuilding, storages, dtypes, ``torch.Size`` (a tuple
here), ``torch.device``, ``OrderedDict``, ``set``, ``frozenset``,
``complex``, bytes, the plain containers pickle builds without globals, and
what ``add_safe_globals`` admits. Any other global is refused before it is
imported; state (BUILD) is set only on objects this load created, of those
types. Every problem with the file, whatever it is, raises one
``pickle.UnpicklingError`` (``_format.LoadError``, also a RuntimeError)
naming the file and the reason, and leaves the process as it was.
``weights_only=False`` unpickles as Python does (it imports and calls what
the file names: trusted files only), mapping PyTorch's globals onto
spmdnet's; the zip records are checked the same way.
"""
import collections
import io
import os
import pickle

from .. import backend, config
from .._device import device as Device
from ._rebuild import (ALLOWED, CALLABLE, REBUILDERS, StorageType, checked_call,
                       user_allowed, warn_dropped_state)
from .._tensor import Tensor
from ..nn.parameter import Parameter
from ._format import ArchiveReader, LoadError, open_source
from ._opcodes import SafeUnpickler
from ._unpickler import Refused, describe

_ATTRIBUTE_STATE = (collections.OrderedDict,)  # BUILD sets attributes (a state dict's _metadata)


class _Storages:
    """The storages a file's persistent ids name, each read once per dtype
    and placed where ``map_location`` says."""

    def __init__(self, archive, map_location):
        self._archive, self._map, self._loaded = archive, map_location, {}

    def load(self, pid):
        if not (type(pid) is tuple and len(pid) == 5 and type(pid[0]) is str
                and pid[0] == "storage" and isinstance(pid[1], StorageType)):
            raise Refused(f"persistent id {describe(pid)} is not a torch storage "
                          "('storage', torch.<Kind>Storage, key, location, numel)")
        _, kind, key, location, numel = pid
        if type(key) is not str or len(key) > 200:
            raise Refused(f"storage key {describe(key)} is not a short str")
        if type(location) is not str or len(location) > 64:
            raise Refused(f"storage location {describe(location)} is not a device name")
        if type(numel) is not int or not 0 <= numel <= 1 << 60:
            raise Refused(f"storage size {describe(numel)} is not a number of elements")
        cached = self._loaded.get((key, kind.dtype_name))
        if cached is None:
            array = self._archive.storage(key, kind.dtype_name, numel)
            cached = self._loaded[(key, kind.dtype_name)] = _place(array, location, self._map)
        return cached


class _WeightsOnly(SafeUnpickler):
    """The allow-list: what a weights-only file may name, call and set."""

    def __init__(self, data, encoding, storages, max_objects):
        super().__init__(data, encoding, max_objects)
        self._storages = storages
        self._user = user_allowed()  # as it is now: a later add_safe_globals is not seen
        self._user_ids = {id(obj) for obj in self._user.values()}
        self._user_classes = tuple(obj for obj in self._user.values() if isinstance(obj, type))

    def find_global(self, module, name):
        found = ALLOWED.get((module, name), self._user.get((module, name)))
        if found is None:
            raise Refused(
                f"Weights only load failed: Unsupported global: GLOBAL {module[:100]}."
                f"{name[:100]} is not admitted by spmdnet.load(weights_only=True) (tensors, "
                "Parameter, OrderedDict, Size, device, dtypes, set, frozenset, complex and "
                "plain containers). Nothing from the file was run. If you trust this global, "
                "admit it with spmdnet.serialization.add_safe_globals([...]); "
                "weights_only=False imports and calls whatever the file names: use it only "
                "for a file you trust.")
        return found

    def call(self, func, args):
        if id(func) in self._user_ids:
            return func(*args)  # the user vouched for it
        if id(func) not in CALLABLE:
            raise Refused(f"calling {_name(func)} is not admitted (only torch's rebuild "
                          "functions, Size, device, OrderedDict, set, frozenset, complex and "
                          "what add_safe_globals admits are called)")
        if func is _rebuild_from_type:
            return self._rebuild_from_type(*args)
        return checked_call(func, args, self.check_key)

    def _rebuild_from_type(self, func=None, new_type=None, args=None, state=None, *rest):
        """``_rebuild_from_type_v2(func, type, args, state)``: PyTorch's wrapper
        for tensor subclasses, Tensor and Parameter only."""
        if rest or id(func) not in REBUILDERS or type(args) is not tuple or (
                new_type is not Tensor and new_type is not Parameter):
            raise Refused("_rebuild_from_type_v2 takes a tensor rebuild function, Tensor or "
                          f"Parameter and a tuple, got {describe(func)}, {describe(new_type)}, "
                          f"{describe(args)}")
        out = checked_call(func, args, self.check_key)
        warn_dropped_state(state, "tensor")
        if new_type is Parameter and not isinstance(out, Parameter):
            out = Parameter(out.array, requires_grad=out.requires_grad)
        return out

    def new(self, cls, args, kwargs):
        if id(cls) in self._user_ids and isinstance(cls, type):
            return cls.__new__(cls, *args, **kwargs)
        if cls is collections.OrderedDict and not args and not kwargs:
            return collections.OrderedDict()
        raise Refused(f"creating {_name(cls)} through __new__ (NEWOBJ) is not admitted: only "
                      "OrderedDict and the classes add_safe_globals admits")

    def build(self, obj, state):
        kind = type(obj)
        if isinstance(obj, self._user_classes):  # np.dtype admits Float64DType's instances
            _build_like_pickle(obj, state)
        elif kind in _ATTRIBUTE_STATE:
            for name, value in _attributes(state).items():
                if type(name) is not str or name.startswith("__") or hasattr(kind, name):
                    raise Refused(f"BUILD would set the attribute {describe(name)} of an "
                                  f"{kind.__name__}, which is not a plain attribute")
                setattr(obj, name, value)
        elif kind in (Tensor, Parameter):
            if _attributes(state):
                raise Refused(f"BUILD would set attributes of a {kind.__name__}; spmdnet "
                              "tensors hold none")
        else:
            raise Refused(f"setting the state of {describe(obj)} (BUILD) is not admitted: only "
                          "OrderedDict attributes and the classes add_safe_globals admits")

    def persistent_load(self, pid):
        return self._storages.load(pid)


def _attributes(state):
    """BUILD's state as one dict of attributes: a dict, or (dict, slots)."""
    parts = state if type(state) is tuple and len(state) == 2 else (state,)
    merged = {}
    for part in parts:
        if part is not None and type(part) is not dict:
            raise Refused(f"BUILD's state is {describe(part)}, not a dict of attributes")
        merged.update(part or {})
    return merged


def _build_like_pickle(obj, state):
    """Python's own BUILD, for a class the user admitted."""
    setstate = getattr(obj, "__setstate__", None)
    if setstate is not None:
        setstate(state)
        return
    slots = None
    if type(state) is tuple and len(state) == 2:
        state, slots = state
    if state:
        vars(obj).update(state)
    for name, value in (slots or {}).items():
        setattr(obj, name, value)


def _name(obj):
    return getattr(obj, "__qualname__", None) or describe(obj)


_rebuild_from_type = ALLOWED[("torch._tensor", "_rebuild_from_type_v2")]


class _FullUnpickler(pickle.Unpickler):
    """``weights_only=False``: Python's unpickler, PyTorch's globals mapped."""

    def __init__(self, data, encoding, storages, description):
        super().__init__(io.BytesIO(data), encoding=encoding)
        self._storages, self._description = storages, description

    def find_class(self, module, name):
        found = ALLOWED.get((module, name), user_allowed().get((module, name)))
        if found is not None:
            return found
        if module == "torch" or module.startswith("torch."):
            raise Refused(f"it names the PyTorch global {module}.{name}, which spmdnet has "
                          "no counterpart for")
        return super().find_class(module, name)

    def persistent_load(self, pid):
        return self._storages.load(pid)


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
    try:
        kind = Device(target).type
    except (TypeError, ValueError) as e:
        raise Refused(f"storage location {describe(target)} is not a device ({e})") from None
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


def _physical_memory():
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 1 << 40


def _limit(max_bytes):
    if max_bytes is None:
        return config.get_bytes("SPMDNET_LOAD_MAX_BYTES", None) or _physical_memory()
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"load(max_bytes={max_bytes!r}): expected a whole number of bytes "
                         ">= 0")
    return max_bytes


def load(f, map_location=None, pickle_module=None, *, weights_only=True, mmap=None,
         max_bytes=None, **pickle_load_args):
    """Read what ``torch.save`` (or ``spmdnet.save``) wrote to ``f`` (a path
    or a binary file object). ``map_location``: None (each tensor where it
    was saved), a device or name, a dict of location names, or a callable
    ``(storage, location) -> storage``. ``mmap`` is accepted and ignored:
    storages are read into memory. ``max_bytes`` (spmdnet's): the most bytes
    the load may read into memory, checked against the sizes the file's
    records declare before any is read (default ``SPMDNET_LOAD_MAX_BYTES``,
    else the machine's physical memory)."""
    if pickle_module not in (None, pickle):
        raise ValueError(f"load() reads with Python's pickle; pickle_module="
                         f"{pickle_module!r} is not supported")
    encoding = pickle_load_args.pop("encoding", "utf-8")
    if pickle_load_args:
        raise TypeError(f"load() got unexpected keyword arguments {sorted(pickle_load_args)}")
    limit = _limit(max_bytes)
    weights_only = True if weights_only is None else weights_only  # PyTorch >= 2.6's default
    stream, description, close = open_source(f)
    try:
        try:
            archive = ArchiveReader(stream, description, limit)
            data = archive.read("data.pkl", limit=archive.budget)
            storages = _Storages(archive, map_location)
            if weights_only:
                # ~100 bytes per container or object built (a list is 56 and more)
                objects = archive.budget // 100
                return _WeightsOnly(data, encoding, storages, objects).load()
            return _FullUnpickler(data, encoding, storages, description).load()
        except Refused as e:
            raise LoadError(f"{description}: {e}") from None
    finally:
        if close:
            stream.close()
