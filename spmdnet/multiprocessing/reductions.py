"""How ``spmdnet.multiprocessing`` pickles tensors (PyTorch's
``torch.multiprocessing.reductions``): a tensor in shared memory
(``Tensor.share_memory_()``, ``Module.share_memory()``) given to a
``spawn``/``forkserver`` process or put on a queue is rebuilt there over
the same memory, its memfd passed along (PyTorch's ``file_descriptor``
strategy); any other tensor is copied, as in PyTorch. ``init_reductions``
registers this with ``multiprocessing``'s pickler (only there: ``pickle``
and ``spmdnet.save`` are unchanged). Hogwild training: share the model,
then let each process train it with its own optimizer.
"""
from multiprocessing import reduction

import numpy as np

from .. import backend
from .._tensor import Tensor
from ..nn.parameter import Parameter
from ..ops import shared_storage


def _rebuild(cls, fd, nbytes, dtype, shape, offset, strides, requires_grad):
    buf = shared_storage.map_shared(nbytes, fd.detach())
    array = np.ndarray(shape, dtype=np.dtype(dtype), buffer=buf, offset=offset,
                       strides=strides)
    return cls(array, requires_grad=requires_grad)


def _reduce_tensor(tensor):
    array = tensor.array
    base = None if backend.is_cupy_array(array) else shared_storage.shared_base(array)
    fd = -1 if base is None else shared_storage.descriptor(base)
    if fd < 0:  # not shared (or no descriptor to pass on): a copy, as PyTorch's
        return tensor.__reduce_ex__(4)
    start = np.frombuffer(base, np.uint8).__array_interface__["data"][0]
    offset = array.__array_interface__["data"][0] - start
    return _rebuild, (type(tensor), reduction.DupFd(fd), len(base), array.dtype.str,
                      array.shape, offset, array.strides, tensor.requires_grad)


def init_reductions():
    """Register the reduction for Tensor and Parameter (idempotent)."""
    for cls in (Tensor, Parameter):
        reduction.ForkingPickler.register(cls, _reduce_tensor)


__all__ = ["init_reductions"]
