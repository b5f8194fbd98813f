"""Where ``fully_shard`` keeps a unit's parameters: the unsharded storage
and, under ``CPUOffloadPolicy``, the host shards.

``UnshardedStorage`` holds one unit's gathered (full) parameters in one
buffer, each parameter a fixed view of it. The views are what forward runs
on, so the autograd graph saves (views of) these arrays. ``release`` gives
the buffer's memory back while the views stay valid, as PyTorch resizes the
unsharded storage to zero after forward; ``fill`` writes the all-gathered
values into the same memory again before the unit's backward reads them.

On NumPy the buffer is an anonymous private ``mmap``: ``release`` is
``madvise(MADV_DONTNEED)``, which on Linux drops the physical pages (the
process's resident memory shrinks by the buffer's size; until the next
``fill`` the views read zeros). Where the platform has no ``MADV_DONTNEED``
the pages are zeroed instead and stay resident. A CuPy buffer cannot drop
its device memory while arrays view it: ``release`` keeps it (``resident``
stays True, so the bookkeeping says so).
"""
import mmap

import numpy as np

from ...backend import asnumpy, is_cupy_array, require_cupy, to_device, xp_of

_ALIGN = 64  # bytes between views' starts: every view aligned for vector loads
_CAN_DROP = hasattr(mmap, "MADV_DONTNEED")
_HUGE = 2 << 20  # a transparent huge page


def _layout(specs):
    """(byte offsets of the views, total bytes) for ``specs`` [(shape, dtype)]."""
    offsets, end = [], 0
    for shape, dtype in specs:
        offsets.append(end)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        end += -(-nbytes // _ALIGN) * _ALIGN
    return offsets, end


def _host_mapping(nbytes):
    """(An anonymous private mmap, a uint8 array of ``nbytes`` over it).
    Private: a shared anonymous mapping keeps its pages in shmem after
    madvise. From 2 MiB on, the array starts on a 2 MiB boundary of a
    mapping advised to use transparent huge pages: refilling released
    memory then faults once per 2 MiB instead of once per 4 KiB page (a
    4 MiB unit's fill and release: about 0.5 ms instead of 5.6 ms)."""
    huge = _HUGE if nbytes >= _HUGE and hasattr(mmap, "MADV_HUGEPAGE") else 0
    mapping = mmap.mmap(-1, max(nbytes + huge, mmap.PAGESIZE),
                        flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(mapping, np.uint8)
    if not huge:
        return mapping, whole
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without transparent huge pages: 4 KiB pages
        pass
    start = -whole.ctypes.data % huge
    return mapping, whole[start:start + nbytes]


class UnshardedStorage:
    """One buffer holding a unit's full parameters ``specs`` [(shape, dtype)]
    on ``device`` ("cpu" or "gpu"); ``views`` are the parameters' arrays."""

    def __init__(self, specs, device):
        offsets, total = _layout(specs)
        self.nbytes, self.device = total, device
        if device == "gpu":
            self.buffer = require_cupy().empty(max(total, 1), np.uint8)
            base = self.buffer
        else:
            self.buffer, base = _host_mapping(total)
        self.views = []
        for (shape, dtype), start in zip(specs, offsets):
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            self.views.append(base[start:start + n].view(dtype).reshape(shape))
        self.resident = True  # the buffer's memory is held (True after fill)

    def fill(self, arrays):
        """Write ``arrays`` (the gathered parameters, in ``specs`` order) into the views."""
        for view, arr in zip(self.views, arrays):
            view[...] = arr
        self.resident = True

    def release(self):
        """Give the buffer's memory back; the views stay valid (and read zeros on NumPy)."""
        if self.device == "gpu":
            return  # see the module docstring: device memory stays while views exist
        if _CAN_DROP:
            self.buffer.madvise(mmap.MADV_DONTNEED)
        else:
            for view in self.views:
                view[...] = 0
            return
        self.resident = False

    def holds(self, array):
        """Whether ``array`` may be a view of this buffer."""
        if self.device == "gpu" or is_cupy_array(array):
            return is_cupy_array(array) and self.device == "gpu" and any(
                xp_of(array).may_share_memory(array, v) for v in self.views)
        return any(np.may_share_memory(array, v) for v in self.views)


def host_copy(array, pin_memory):
    """``CPUOffloadPolicy``'s shard: a host NumPy copy of ``array`` (a device
    array goes to page-locked memory when ``pin_memory``); a NumPy array is
    already on the host and is kept as it is."""
    if not is_cupy_array(array):
        return array
    if not pin_memory:
        return asnumpy(array)
    mem = require_cupy().cuda.alloc_pinned_memory(max(array.nbytes, 1))
    host = np.frombuffer(mem, array.dtype, array.size).reshape(array.shape)
    host[...] = asnumpy(array)
    return host


def on_device(array, device):
    """``array`` on ``device`` (a copy only when it lives elsewhere)."""
    return array if (device == "gpu") == is_cupy_array(array) else to_device(array, device)
