"""Compiled hot paths (Numba, CPU), each tested against the plain-xp code it replaces.

=============  ======================================  ===================================
module         kernels                                 used by (the xp reference)
=============  ======================================  ===================================
activation     bias + activation, forward/backward     ops.linalg.LinearAct, ops.unary
loss           softmax cross-entropy, fwd/bwd          ops.losses.CrossEntropy
norm           layer norm, forward/backward            ops.nn_ops.LayerNorm
batch_norm     batch statistics, normalise (running    ops.batchnorm.BatchNorm,
               stats too), gradient sums, input grad   BatchNormEval (via norm)
softmax        softmax fwd/bwd, log-sum-exp            ops.nn_ops.Softmax, ops.attention
embedding      embedding backward (row scatter-add)    ops.nn_ops.Embedding
attention      Philox dropout mask (plain xp, no       ops.attention's dropout on a GPU
               compiled kernel)
optim_kernels  SGD and Adam/AdamW updates (maximize,    optim.SGD, optim.Adam
               amsgrad)
special        float32 exp, erf for kernels;           the kernels above; ``erf_array``:
               erf on arrays in plain xp               ops.unary's exact GELU
reduce         8-lane row sums/max                     the kernels above
conv           channels-last padding, col2im (the      ops.conv_columns (ops.conv.Conv2d,
               columns a row per output pixel)         ops.conv_transpose.ConvTranspose2d)
conv_direct    direct stride-1 forward, input and      ops.conv.Conv2d on few input
               weight gradients (no columns); the      channels (dispatch.conv_direct_takes)
               weight gradient's: conv_direct_grad
pool           max pooling with argmax                 ops.pooling.MaxPool2d
winograd       F(2x2, 3x3) forward and backward over   ops.conv.Conv2d, stride-1 3x3 on
               blocks of images, with the GEMMs; its   many channels (dispatch.winograd_takes)
               compiled passes: winograd_transforms
=============  ======================================  ===================================

The one seam between ops and kernels is ``lookup(op, *arrays, step=...)``:
a kernel to call, or None (then the op runs its xp code). All policy is
``dispatch.TABLE``, and every compiled kernel is reachable from one of its
rows (tests/test_kernels_dispatch.py checks). The switch is
``SPMDNET_KERNELS`` (``numba``, the default, or ``xp``), read once, and
``with kernels.use("xp"): ...`` for a block. CuPy arrays always take CuPy's
own code: numba.cuda twins of these kernels measured 2x slower than it on
an H100 (launch overhead) and were removed.

Behind it, one module per job: ``_numba`` (the only ``import numba``),
``_cpu`` (a plain Python body compiled at its first call, single-threaded),
``_float32`` (float32 fast paths of transcendental functions), ``_cache``
(the disk cache, on by default), ``_target`` (which arrays a kernel takes),
``compile_order`` (ranks taking turns to fill a shared cache; pure and
duck-typed in ``comm``, re-exported as ``spmdnet.distributed.compile_in_order``).
``warmup()`` compiles every kernel up front, in rank order with ``comm``
(``compile_in_order``), and reports how long it took.
"""
import time

import numpy as np

from .._tensor import get_default_dtype
from . import _cache, activation, compile_order, conv, conv_direct, embedding
from . import loss, norm, optim_kernels, pool, rnn_cell, softmax, winograd
from ._cache import cache_dir
from ._numba import compile_seconds
from .dispatch import TABLE, enabled, lookup, mode, use
from .special import erf_array as erf

__all__ = ["lookup", "use", "mode", "enabled", "TABLE", "erf", "warmup", "compile_seconds",
           "cache_dir", "compile_in_order"]

_MODULES = (activation, loss, norm, softmax, embedding, optim_kernels, conv,
            conv_direct, pool, rnn_cell, winograd)


def compile_in_order(compile_fn, comm=None):
    """``compile_fn()`` on every rank of ``comm``, in turns (rank 0, one rank
    per other host, the rest) while the kernel disk cache is on; see
    ``spmdnet.kernels.compile_order.compile_in_order``."""
    cache = cache_dir() if _cache.use() else None
    return compile_order.compile_in_order(compile_fn, comm, cache=cache)


def warmup(dtypes=None, comm=None):
    """Compile every CPU kernel now (or load it from the disk cache) and
    return the seconds it took (0 when kernels are off or Numba is missing).

    ``dtypes``: the float dtypes to compile for (default: spmdnet's default
    dtype). ``comm`` (an mpi4py communicator, optional): rank 0 compiles
    first, then one rank per other host, then the rest, which load from the
    cache (``compile_in_order``); every rank of ``comm`` must call this then."""
    if dtypes is None:
        dtypes = [get_default_dtype()]
    if not enabled():
        return 0.0

    def compile_all():
        t0 = time.perf_counter()
        for dtype in dtypes:
            for module in _MODULES:
                module.warmup(np.dtype(dtype))
        return time.perf_counter() - t0

    return compile_in_order(compile_all, comm)
