"""The only module that imports Numba.

When Numba is missing the callers fall back to plain-xp code and one warning
says so. Kernels are compiled lazily, at first use, so importing spmdnet stays
fast and never needs a compiler.
"""
import warnings

try:
    import numba
    NUMBA_ERROR = None
except ImportError as exc:  # pragma: no cover - numba is a core dependency
    numba = None
    NUMBA_ERROR = exc

_warned = []


def available():
    """True when Numba imported; warns once (with the import error) when not."""
    if numba is None and not _warned:
        _warned.append(True)
        warnings.warn(f"Numba is unavailable ({NUMBA_ERROR!r}); spmdnet runs its "
                      "plain NumPy code paths instead", RuntimeWarning, stacklevel=3)
    return numba is not None


def vectorize(signatures, fn):
    """``numba.vectorize`` of a scalar function with fixed signatures."""
    return numba.vectorize(signatures, nopython=True, cache=False)(fn)


prange = numba.prange if numba is not None else range


def njit_serial(fn):
    """``fn`` compiled for the CPU, single-threaded.

    Measured on benchmarks/mlp_step.py at 2 BLAS threads: parallel=True made
    the step 1.2x (workqueue layer) to 4x (omp layer) slower, because Numba's
    threads fight OpenBLAS's spinning workers for the cores, while these
    memory-bound loops gain little from a second thread. ``prange`` in the
    bodies marks loops that are safe to parallelise later."""
    return numba.njit(parallel=False, fastmath=False, cache=False)(fn)
