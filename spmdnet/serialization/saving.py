"""``spmdnet.save``: objects to PyTorch's zip file format (see _format.py).

Tensors, Parameters, NumPy/CuPy arrays (saved as tensors), dtypes and
devices are written as the globals PyTorch's ``weights_only`` loader admits
(``torch._utils._rebuild_tensor_v2``, ``torch.FloatStorage``,
``torch.float32``, ``torch.device``...), NumPy scalars as Python numbers,
so ``torch.load(f, weights_only=True)`` reads a state dict written here.
Other objects are pickled as Python pickles them (a file PyTorch then reads
only with ``weights_only=False``, as it would a custom class).

The pickler is Python's pure-Python one: it lets this module name PyTorch's
globals without PyTorch installed (the C pickler insists on importing them).
"""
import collections
import io
import os
import pickle

import numpy as np

from .._device import device as Device
from .._tensor import Tensor
from ..backend import asnumpy, data_address, is_cupy_array
from ..nn.parameter import Parameter
from . import _format


class TorchGlobal:
    """A PyTorch global (``module.name``) written into the pickle by name."""

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args):  # pickle's save_reduce insists on a callable
        raise TypeError(f"{self.module}.{self.name} is a name in a file, not a function")


REBUILD_TENSOR = TorchGlobal("torch._utils", "_rebuild_tensor_v2")
REBUILD_PARAMETER = TorchGlobal("torch._utils", "_rebuild_parameter")
TORCH_DEVICE = TorchGlobal("torch", "device")
_STORAGE_TYPES = {name: TorchGlobal("torch", name) for name in _format.DTYPE_OF_STORAGE}
_DTYPES = {name: TorchGlobal("torch", torch_name)
           for name, torch_name in _format.TORCH_NAME_OF_DTYPE.items()}


class StorageRef:
    """One storage of the file: its key, element type, location, size."""

    def __init__(self, key, dtype_name, location, numel):
        self.key, self.dtype_name, self.location, self.numel = key, dtype_name, location, numel


class _PlainTensor:
    """A Parameter's data, pickled as a tensor without requires_grad."""

    def __init__(self, array):
        self.array = array


class _TorchPickler(pickle._Pickler):
    def __init__(self, file):
        super().__init__(file, protocol=2)
        self.storages = {}  # id(root array) -> (StorageRef, root host array)
        self._keep = []  # arrays whose ids are keys above stay alive until the end

    def persistent_id(self, obj):
        if isinstance(obj, StorageRef):
            return ("storage", _STORAGE_TYPES[_format.STORAGE_OF_DTYPE[obj.dtype_name]],
                    obj.key, obj.location, obj.numel)
        return None

    def save(self, obj, save_persistent_id=True):
        if isinstance(obj, np.generic):
            obj = obj.item()  # a Python number: PyTorch's loader admits no NumPy scalar
        elif isinstance(obj, np.dtype) or (isinstance(obj, type) and issubclass(obj, np.generic)):
            obj = _dtype_global(obj)  # np.float32 and np.dtype("float32") alike
        if isinstance(obj, TorchGlobal):
            self._save_torch_global(obj)
        else:
            super().save(obj, save_persistent_id)

    def _save_torch_global(self, obj):
        memo = self.memo.get(id(obj))
        if memo is not None:
            self.write(self.get(memo[0]))
            return
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
        self.memoize(obj)

    def reducer_override(self, obj):
        if isinstance(obj, Parameter):
            return REBUILD_PARAMETER, (_PlainTensor(obj.array), obj.requires_grad,
                                       collections.OrderedDict())
        if isinstance(obj, Tensor):
            return self._tensor(obj.array, obj.requires_grad)
        if isinstance(obj, _PlainTensor):
            return self._tensor(obj.array, False)
        if isinstance(obj, np.ndarray) or is_cupy_array(obj):
            return self._tensor(obj, False)
        if isinstance(obj, Device):
            return TORCH_DEVICE, (str(obj),)
        return NotImplemented

    def _tensor(self, array, requires_grad):
        storage, offset, stride = self._storage_of(array)
        return REBUILD_TENSOR, (storage, offset, tuple(int(n) for n in array.shape), stride,
                                bool(requires_grad), collections.OrderedDict())

    def _storage_of(self, array):
        """(StorageRef, offset, strides) in elements; a view of an array
        already saved names that array's storage (tied weights, views), on
        the GPU as on the host."""
        on_gpu = is_cupy_array(array)
        if array.dtype.name not in _format.STORAGE_OF_DTYPE or not array.dtype.isnative:
            raise TypeError(f"save() cannot write a tensor of dtype {array.dtype} "
                            f"(PyTorch storages: {sorted(_format.STORAGE_OF_DTYPE)})")
        root = array
        while (is_cupy_array(root.base) if on_gpu else isinstance(root.base, np.ndarray)):
            root = root.base  # down to the array that owns the memory
        shared = _view_of(array, root)
        if shared is None:
            root = array.copy(order="C")  # its own storage
            offset, stride = 0, _contiguous_strides(array.shape)
        else:
            offset, stride = shared
        if id(root) not in self.storages:
            location = f"cuda:{root.device.id}" if on_gpu else "cpu"
            ref = StorageRef(str(len(self.storages)), array.dtype.name, location, int(root.size))
            self.storages[id(root)] = (ref, root)
            self._keep.append(root)
        return self.storages[id(root)][0], offset, stride


def _contiguous_strides(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


def _view_of(array, root):
    """(offset, strides) of ``array`` inside the C-contiguous ``root``, in
    elements, or None when it cannot be described that way (another dtype,
    a negative or fractional stride, a non-contiguous root, no elements)."""
    if root is array and array.flags.c_contiguous:
        return 0, _contiguous_strides(array.shape)
    size = array.dtype.itemsize
    if (root.dtype != array.dtype or not root.flags.c_contiguous or array.size == 0
            or any(s < 0 or s % size for s in array.strides)):
        return None
    gap = data_address(array) - data_address(root)
    if gap < 0 or gap % size:
        return None
    return gap // size, tuple(s // size for s in array.strides)


def _storage_bytes(root):
    """The storage's bytes, little-endian, as a flat uint8 buffer (a view,
    not a copy, for a host array)."""
    host = asnumpy(root).reshape(-1)
    return memoryview(host.astype(host.dtype.newbyteorder("<"), copy=False).view(np.uint8))


def _dtype_global(dtype):
    name = _format.TORCH_NAME_OF_DTYPE.get(np.dtype(dtype).name)
    if name is None:
        raise TypeError(f"save() cannot write the dtype {dtype}: PyTorch has no such dtype")
    return _DTYPES[np.dtype(dtype).name]


def save(obj, f, pickle_module=None, pickle_protocol=2,
         _use_new_zipfile_serialization=True, _disable_byteorder_record=False):
    """Write ``obj`` to ``f`` (a path or a binary file object) in PyTorch's
    zip format; tensors sharing memory are written once and stay shared."""
    if pickle_module not in (None, pickle):
        raise ValueError("save() writes with Python's pickle; pickle_module="
                         f"{pickle_module!r} is not supported")
    if pickle_protocol != 2:
        raise ValueError(f"save() writes pickle protocol 2 (what PyTorch writes and its "
                         f"weights_only loader reads), got pickle_protocol={pickle_protocol}")
    if not _use_new_zipfile_serialization:
        raise ValueError("save() writes PyTorch's zip format only; the legacy format "
                         "(_use_new_zipfile_serialization=False) is not supported")
    pickled = io.BytesIO()
    pickler = _TorchPickler(pickled)
    pickler.dump(obj)
    if isinstance(f, (str, bytes, os.PathLike)):
        with open(os.fsdecode(f), "wb") as stream:
            _write_archive(stream, pickled.getvalue(), pickler.storages.values(),
                           not _disable_byteorder_record)
    elif hasattr(f, "write"):
        staged = io.BytesIO()  # the archive's offsets start at 0 whatever f's position
        _write_archive(staged, pickled.getvalue(), pickler.storages.values(),
                       not _disable_byteorder_record)
        f.write(staged.getbuffer())
    else:
        raise TypeError(f"save() takes a path or a binary file object, got {type(f).__name__}")


def _write_archive(stream, data_pkl, storages, byteorder_record):
    """The records in PyTorch's order: the pickle, format notes, storages."""
    archive = _format.ArchiveWriter(stream)
    archive.write("data.pkl", data_pkl)
    archive.write(".format_version", b"1")
    archive.write(".storage_alignment", str(_format.ALIGNMENT).encode())
    if byteorder_record:
        archive.write("byteorder", b"little")
    for ref, root in storages:
        archive.write(f"data/{ref.key}", _storage_bytes(root))
    archive.write("version", _format.FILE_VERSION)
    archive.close()
