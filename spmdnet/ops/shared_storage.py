"""``Tensor.share_memory_()`` and ``Tensor.is_shared()``: a host tensor's
array moved into memory that other processes can map.

The memory is a Linux memfd mapped ``MAP_SHARED`` (elsewhere an anonymous
shared mapping): a process forked afterwards writes the same memory, and
``spmdnet.multiprocessing`` passes the memfd to ``spawn``/``forkserver``
processes and through its queues (``multiprocessing/reductions.py``), so a
shared tensor arrives there as the same memory. GPU tensors are left as
they are (PyTorch: CUDA tensors are shared by IPC handles; not here).
"""
import mmap
import os

import numpy as np

from .. import backend

_buffers = {}  # id(mmap) -> (file descriptor or -1, the mmap): keeps both alive


def map_shared(nbytes, fd=None):
    """A MAP_SHARED mapping of at least one byte: a new memfd, or ``fd``'s."""
    size = max(int(nbytes), 1)
    if fd is None:
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("spmdnet-shared-tensor")
            os.ftruncate(fd, size)
        else:
            fd = -1
    buf = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    _buffers[id(buf)] = (fd, buf)
    return buf


def shared_base(array):
    """The shared mapping under ``array`` (a view's base chain), else None."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's base
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None


def descriptor(buf):
    """The file descriptor of a mapping made by ``map_shared`` (-1: none)."""
    return _buffers.get(id(buf), (-1,))[0]


def is_shared(tensor):
    """Whether ``tensor``'s host memory is a shared mapping (a GPU tensor: False)."""
    array = tensor.array
    return not backend.is_cupy_array(array) and shared_base(array) is not None


def share_memory_(tensor):
    """Move ``tensor``'s array into shared memory, in place (the Tensor
    object, its grad and requires_grad stay); a no-op when shared already or
    on a GPU. Returns ``tensor``."""
    array = tensor.array
    if backend.is_cupy_array(array) or shared_base(array) is not None:
        return tensor
    buf = map_shared(array.nbytes)
    shared = np.frombuffer(buf, array.dtype, count=array.size).reshape(array.shape)
    shared[...] = array
    tensor.data = shared
    return tensor


METHODS = {"share_memory_": share_memory_, "is_shared": is_shared}
