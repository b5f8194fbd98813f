"""CPU kernels: a plain Python body, compiled at its first call."""
from . import _cache
from ._numba import njit


class CpuKernel:
    """A plain Python kernel body, compiled with ``_numba.njit`` at its first
    call (through the disk cache unless ``SPMDNET_KERNEL_CACHE=0``);
    ``.body`` is the plain function, ``.compiled`` Numba's dispatcher.
    ``fastmath``: LLVM fast-math flags for this kernel alone (``_numba.njit``)."""

    def __init__(self, body, fastmath=None):
        self.body = body
        self.fastmath = fastmath
        self.compiled = None
        self.__name__ = body.__name__
        self.__doc__ = body.__doc__

    def __call__(self, *args):
        fn = self.compiled
        if fn is None:
            fn = self.compiled = njit(self.body, cache=_cache.use(), fastmath=self.fastmath)
        return fn(*args)
