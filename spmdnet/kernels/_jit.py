"""The only module that imports Numba.

When Numba is missing the callers fall back to plain-xp code and one warning
says so. Kernels are compiled lazily, at first use (or in ``warmup``), so
importing spmdnet stays fast and never needs a compiler; ``numba.cuda`` is
imported only when a CuPy array first reaches a kernel.

Kernel bodies live in the other modules of this package as plain Python
functions over arrays (the reference when ``NUMBA_DISABLE_JIT=1``) and are
compiled here: ``CpuKernel`` for the CPU, ``cuda_jit`` for CuPy arrays.

Compile cache (``SPMDNET_KERNEL_CACHE=1``, off by default): compiled CPU
kernels are kept in a node-local directory (``cache_dir``), and
``compile_in_order`` lets rank 0 compile first, then one rank per other
host, then the rest, so that ranks never race writing one cache.
"""
import os
import socket
import tempfile
import time
import warnings

import numpy as np

from .. import config

try:
    import numba
    NUMBA_ERROR = None
except ImportError as exc:  # pragma: no cover - numba is a core dependency
    numba = None
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


def kernels_on():
    """``SPMDNET_KERNELS`` is ``numba`` (the default) and Numba imports."""
    return config.get_choice("SPMDNET_KERNELS", {"numba", "xp"}, "numba") == "numba" \
        and available()


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def target(*arrays):
    """Where kernels run for these float arrays: ``"cpu"`` (all NumPy),
    ``"cuda"`` (all CuPy, and numba.cuda usable), or None (the xp path):
    also None when kernels are switched off, or the arrays mix types or
    dtypes or are not float32/float64. ``None`` entries are skipped."""
    if not kernels_on():
        return None
    arrays = [a for a in arrays if a is not None]
    kind, dtype = type(arrays[0]), arrays[0].dtype
    if dtype not in _FLOATS or any(type(a) is not kind or a.dtype != dtype for a in arrays):
        return None
    if kind is np.ndarray:
        return "cpu"
    if kind.__module__.startswith("cupy") and cuda_usable():
        return "cuda"
    return None


def jit_disabled():
    """True under ``NUMBA_DISABLE_JIT=1`` (bodies run as plain Python)."""
    return numba is None or bool(numba.config.DISABLE_JIT)


def vectorize(signatures, fn):
    """``numba.vectorize`` of a scalar function with fixed signatures."""
    return numba.vectorize(signatures, nopython=True, cache=False)(fn)


prange = numba.prange if numba is not None else range

# Compilation options of every CPU kernel. error_model="numpy": a float
# division by zero gives inf/nan as in NumPy instead of a Python exception;
# the exception check in the loop would also stop LLVM from vectorising it.
_OPTIONS = {"parallel": False, "fastmath": False, "error_model": "numpy", "nogil": True}


def njit_serial(fn, cache=False):
    """``fn`` compiled for the CPU, single-threaded.

    Measured on benchmarks/mlp_step.py at 2 BLAS threads: parallel=True made
    the step 1.2x (workqueue layer) to 4x (omp layer) slower, because Numba's
    threads fight OpenBLAS's spinning workers for the cores, while these
    memory-bound loops gain little from a second thread (a second Python
    thread running nogil kernels did no better). ``prange`` in the bodies
    marks loops that are safe to parallelise later."""
    return numba.njit(cache=cache, **_OPTIONS)(fn)


def njit_inline(fn):
    """A scalar helper for kernels, inlined into its callers."""
    if numba is None:
        return fn
    return numba.njit(inline="always", **_OPTIONS)(fn)


_compile_seconds = [0.0]


class CpuKernel:
    """A plain Python kernel body, compiled with ``njit_serial`` at first call.

    ``kernel.body`` is the uncompiled function. Compile time is added to
    ``compile_seconds()`` so benchmarks can report it apart from step times.
    Compiles keep the disk cache when ``SPMDNET_KERNEL_CACHE=1``."""

    def __init__(self, body):
        self.body = body
        self.compiled = None
        self.__name__ = body.__name__
        self.__doc__ = body.__doc__

    def __call__(self, *args):
        fn = self.compiled
        if fn is None:
            fn = self.compiled = njit_serial(self.body, cache=_use_cache())
            if jit_disabled():
                return fn(*args)
        compiled = len(getattr(fn, "overloads", ()))
        t0 = time.perf_counter()
        out = fn(*args)
        if len(getattr(fn, "overloads", ())) != compiled:  # this call compiled (or loaded)
            _compile_seconds[0] += time.perf_counter() - t0
        return out


def compile_seconds():
    """Seconds spent so far compiling kernels (first calls) in this process."""
    return _compile_seconds[0]


# --- float32 fast paths for transcendental functions ----------------------------------
# Numba calls libm (or CPython's own code, for erf) one element at a time:
# 2-40 ns per element, 5-100x slower than NumPy's SIMD loops. Kernels call
# the plain functions in special.py; for float32 arguments they compile to a
# polynomial version in plain arithmetic instead, which LLVM vectorises.

def float32_variant(py_fn, float32_fn):
    """Inside compiled kernels, calls of ``py_fn`` with a float32 argument run
    ``float32_fn``; other calls (and plain Python) run ``py_fn`` itself."""
    if numba is None:
        return

    @numba.extending.overload(py_fn, jit_options={"error_model": "numpy"})
    def _overload(x):
        if isinstance(x, numba.types.Float) and x.bitwidth == 32:
            return float32_fn
        return py_fn


if numba is not None:
    from llvmlite import ir as _ir

    @numba.extending.intrinsic
    def float32_from_bits(typingctx, bits):
        """The float32 whose IEEE bit pattern is the int32 ``bits`` (compiled
        code only: the float32 variants, never plain Python, call it)."""
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], _ir.FloatType())
        return numba.types.float32(numba.types.int32), codegen
else:  # pragma: no cover
    float32_from_bits = None


# --- CUDA ---------------------------------------------------------------------------
_cuda = []


def cuda():
    """The ``numba.cuda`` module, imported at first need (about 0.8 s)."""
    if not _cuda:
        import numba.cuda as cuda_module  # noqa: PLC0415 - lazy: costly import
        _cuda.append(cuda_module)
    return _cuda[0]


_cuda_ok = []


def cuda_usable():
    """True when numba.cuda can launch kernels (a GPU, or the simulator);
    otherwise CuPy arrays take the plain CuPy paths, and one warning says why."""
    if not _cuda_ok:
        try:
            ok, why = bool(cuda().is_available()), "no CUDA device or driver found"
        except Exception as exc:  # a broken CUDA installation
            ok, why = False, repr(exc)
        _cuda_ok.append(ok)
        if not ok:
            warn_once("cuda", f"numba.cuda is unusable ({why}); CuPy arrays take the "
                              "plain CuPy code paths")
    return _cuda_ok[0]


def cuda_jit(fn):
    """``fn`` compiled as a CUDA kernel (lazily, on first launch)."""
    return cuda().jit(fn)


def launch(kernel, n, *args, stream_of=None, threads=128):
    """Run ``kernel`` over ``n`` work items (1-D grid) on CuPy's current stream."""
    if n == 0:
        return
    blocks = (n + threads - 1) // threads
    kernel[blocks, threads, _stream(stream_of)](*args)


def launch_rows(kernel, rows, *args, stream_of=None, threads=128):
    """Run ``kernel`` with one block of ``threads`` per row (row reductions)."""
    if rows == 0:
        return
    kernel[rows, threads, _stream(stream_of)](*args)


def _stream(array):
    """CuPy's current stream as a Numba stream (0, the default, when plain)."""
    if array is None or not type(array).__module__.startswith("cupy"):
        return 0
    from ..backend import require_cupy  # noqa: PLC0415 - only with CuPy arrays
    ptr = require_cupy().cuda.get_current_stream().ptr
    return cuda().external_stream(ptr) if ptr else 0


# --- compile cache policy for MPI jobs ----------------------------------------------
def cache_dir():
    """Where compiled kernels are kept: ``SPMDNET_KERNEL_CACHE_DIR``, else a
    node-local scratch directory ($SLURM_TMPDIR, $TMPDIR or the system
    temporary directory), never the package directory on a shared filesystem."""
    path = config.get("SPMDNET_KERNEL_CACHE_DIR")
    if path is None:
        base = os.environ.get("SLURM_TMPDIR") or tempfile.gettempdir()
        user = os.environ.get("USER") or str(os.getuid())
        path = os.path.join(base, f"spmdnet-numba-{user}")
    return path


def _use_cache():
    """True when the disk cache is on; points Numba at ``cache_dir()`` then."""
    if not config.get_bool("SPMDNET_KERNEL_CACHE", False) or jit_disabled():
        return False
    path = cache_dir()
    if numba.config.CACHE_DIR != path:
        os.makedirs(path, exist_ok=True)
        numba.config.CACHE_DIR = path
    return True


def _comm_rank_size(comm):
    rank = comm.Get_rank() if hasattr(comm, "Get_rank") else comm.rank
    size = comm.Get_size() if hasattr(comm, "Get_size") else comm.size
    return rank, size


def _barrier(comm):
    (comm.Barrier if hasattr(comm, "Barrier") else comm.barrier)()


def compile_in_order(compile_fn, comm=None):
    """Call ``compile_fn()`` on every rank of ``comm`` and return its result.

    With the disk cache on and a communicator (mpi4py-like: ``Get_rank``,
    ``Get_size``, ``allgather``, ``Barrier``; duck-typed, no MPI import here)
    the ranks take turns: rank 0 compiles and fills its cache first; then the
    lowest rank of every other host (node-local caches are filled once each,
    a shared cache is only read); then all remaining ranks, which load from
    the cache. Without the cache every rank compiles at once: nothing is
    shared, so nothing can race. Every rank calls the same barriers."""
    if comm is None or not _use_cache():
        return compile_fn()
    rank, size = _comm_rank_size(comm)
    if size == 1:
        return compile_fn()
    hosts = comm.allgather(socket.gethostname())
    first_on_host = hosts.index(hosts[rank]) == rank
    phase = 0 if rank == 0 else (1 if first_on_host else 2)
    result = None
    for turn in range(3):
        if phase == turn:
            result = compile_fn()
        _barrier(comm)
    return result
