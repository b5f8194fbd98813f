"""Compiled hot paths (Numba), each tested against the plain-xp code it replaces.

=============  ======================================  ===================================
module         kernels                                 used by (the xp reference)
=============  ======================================  ===================================
activation     bias + activation, forward/backward     ops.linalg.LinearAct, ops.unary
loss           softmax cross-entropy, fwd/bwd          ops.nn_ops.CrossEntropy
norm           layer norm, forward/backward            ops.nn_ops.LayerNorm
embedding      embedding backward (row scatter-add)    ops.nn_ops.Embedding
optim_kernels  SGD and Adam/AdamW updates              optim.SGD, optim.Adam
special        vectorisable float32 exp, erf, tanh     the kernels above
reduce         8-lane row sums/max; CUDA block sums    the kernels above
=============  ======================================  ===================================

The ops take a kernel when ``SPMDNET_KERNELS=numba`` (the default), the
arrays qualify (``_jit.target``: NumPy float32/float64, or CuPy with a
usable numba.cuda) and benchmarks/kernels.py measured it at least 2x faster
than the xp code it replaces (the tables in activation.py, the size limit
in loss.py). Every kernel is a plain Python body compiled for the CPU at
first use, single-threaded (see ``_jit.njit_serial``), plus a numba.cuda
variant for CuPy arrays. ``warmup()`` compiles them up front and reports how
long that took, so compilation stays out of step timings;
``SPMDNET_KERNEL_CACHE=1`` keeps them on disk (``_jit.compile_in_order``).
"""
import time

import numpy as np

from .._tensor import get_default_dtype
from . import _jit, activation, embedding, loss, norm, optim_kernels
from ._jit import cache_dir, compile_in_order, compile_seconds
from .special import erf_array as erf

__all__ = ["erf", "warmup", "compile_seconds", "cache_dir", "compile_in_order"]

_MODULES = (activation, loss, norm, embedding, optim_kernels)


def warmup(dtypes=None, comm=None):
    """Compile every CPU kernel now and return the seconds it took (0 when
    kernels are off or Numba is missing).

    ``dtypes``: the float dtypes to compile for (default: spmdnet's default
    dtype). ``comm`` (an mpi4py communicator, optional): with the disk cache
    on (``SPMDNET_KERNEL_CACHE=1``) rank 0 compiles first, then one rank per
    other host, then the rest, which load from the cache
    (``compile_in_order``); every rank of ``comm`` must call this then."""
    if dtypes is None:
        dtypes = [get_default_dtype()]
    if not _jit.kernels_on():
        return 0.0

    def compile_all():
        t0 = time.perf_counter()
        for dtype in dtypes:
            for module in _MODULES:
                module.warmup(np.dtype(dtype))
        return time.perf_counter() - t0

    return compile_in_order(compile_all, comm)
