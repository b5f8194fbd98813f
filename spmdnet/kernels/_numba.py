"""The only module that imports Numba (and its llvmlite).

When Numba is missing, ``kernels.lookup`` finds no kernel, the ops take
their plain-xp code and one warning says so.
"""
import warnings

try:
    import numba
    from llvmlite import ir
    NUMBA_ERROR = None
except ImportError as exc:  # pragma: no cover - numba is a core dependency
    numba = ir = None
    NUMBA_ERROR = exc

_warned = set()


def warn_once(key, message):
    """One RuntimeWarning per key and process (no silent slow paths)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def available():
    """True when Numba imported; warns once (with the import error) when not."""
    if numba is None:
        warn_once("numba", f"Numba is unavailable ({NUMBA_ERROR!r}); spmdnet runs its "
                           "plain NumPy code paths instead")
    return numba is not None


def jit_disabled():
    """True under ``NUMBA_DISABLE_JIT=1`` (bodies run as plain Python)."""
    return numba is None or bool(numba.config.DISABLE_JIT)


prange = numba.prange if numba is not None else range

# Compilation options of every CPU kernel. error_model="numpy": a float
# division by zero gives inf/nan as in NumPy instead of a Python exception;
# the exception check in the loop would also stop LLVM from vectorising it.
OPTIONS = {"parallel": False, "fastmath": False, "error_model": "numpy", "nogil": True}


def njit(fn, cache=False, fastmath=None):
    """``fn`` compiled for the CPU with ``OPTIONS``, single-threaded.
    ``fastmath``: a set of LLVM fast-math flags for this kernel alone (e.g.
    ``{"reassoc", "contract"}`` lets LLVM vectorise a float sum by splitting
    it into lanes: its rounding then differs from the in-order sum, so only
    kernels whose docstring says so take it).

    Measured on benchmarks/mlp_step.py at 2 BLAS threads: parallel=True made
    the step 1.2x (workqueue layer) to 4x (omp layer) slower, because Numba's
    threads fight OpenBLAS's spinning workers for the cores, while these
    memory-bound loops gain little from a second thread (a second Python
    thread running nogil kernels did no better). ``prange`` in the bodies
    marks loops that are safe to parallelise later."""
    options = dict(OPTIONS)
    if fastmath:
        options["fastmath"] = set(fastmath)
    return numba.njit(cache=cache, **options)(fn)


def njit_inline(fn):
    """A scalar helper for kernels, inlined into its callers."""
    if numba is None:
        return fn
    return numba.njit(inline="always", **OPTIONS)(fn)


if numba is not None:  # compile time, kept apart from step times by benchmarks
    _compile_timer = numba.core.event.TimingListener()
    numba.core.event.register("numba:compile", _compile_timer)


def compile_seconds():
    """Seconds this process has spent compiling Numba code (kernels at their
    first call, or in ``kernels.warmup``; loading from the disk cache is not
    compiling)."""
    return _compile_timer.duration if numba is not None and _compile_timer.done else 0.0
