"""Where a module's tensors live, beyond ``Module.to``: ``to_empty``
(uninitialised storage on a device, as after meta-device construction) and
``share_memory`` (host storage in shared memory, for Hogwild training in
other processes)."""

import numpy as np

from ..._args import resolve_device
from ..._device import device_of_array, meta_array
from ...backend import to_device


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
        where = target or resolve_device(device_of_array(t.array))
        if where == "meta":  # to_empty(device="meta"): shape-only again, as PyTorch
            t.data = meta_array(t.shape, t.array.dtype)
        else:
            t.data = to_device(np.empty(t.shape, t.array.dtype), where)
        t.grad = None
    return module


def share_memory(module):
    """``Tensor.share_memory_()`` on every parameter and buffer (host memory
    mapped shared, see ``ops/shared_storage.py``): a process forked
    afterwards, or one given the module by ``spmdnet.multiprocessing``
    (``spawn``/``forkserver``, queues), updates the same storage in place, as
    PyTorch's ``share_memory`` does for Hogwild. GPU tensors are left as
    they are."""
    for t in module._tensors():
        t.share_memory_()
    return module
