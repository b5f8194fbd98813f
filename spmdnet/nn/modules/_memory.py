"""Where a module's tensors live, beyond ``Module.to``: ``to_empty``
(uninitialised storage on a device, as after meta-device construction) and
``share_memory`` (host storage in shared memory, for Hogwild training in
forked processes)."""
import mmap

import numpy as np

from ..._args import resolve_device
from ...backend import device_of, is_cupy_array, to_device


def _own_tensors(module, recurse):
    if recurse:
        return module._tensors()
    return [t for table in (module._parameters, module._buffers) for t in table.values()
            if t is not None]


def to_empty(module, device, recurse):
    """Give every parameter and buffer fresh, uninitialised storage of its
    shape and dtype on ``device`` (None: where it is); the Parameter objects
    stay the same (an optimizer built on them keeps working)."""
    target = resolve_device(device, use_default=False)
    for t in _own_tensors(module, recurse):
        where = target or device_of(t.array)
        t.data = to_device(np.empty(t.shape, t.array.dtype), where)
        t.grad = None
    return module


def share_memory(module):
    """Move every host parameter and buffer into shared memory (an anonymous
    shared mapping, kept by the array), so a process forked afterwards (a
    ``fork`` start method) updates the same storage in place, as PyTorch's
    ``share_memory`` does for Hogwild. GPU tensors are left as they are."""
    for t in module._tensors():
        a = t.array
        if is_cupy_array(a) or _is_shared(a):
            continue
        buf = mmap.mmap(-1, max(a.nbytes, 1), flags=mmap.MAP_SHARED)
        shared = np.frombuffer(buf, a.dtype, count=a.size).reshape(a.shape)
        shared[...] = a
        t.data = shared
    return module


def _is_shared(a):
    base = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return isinstance(base, mmap.mmap)
