"""The only module that imports Numba.

When Numba is missing the callers fall back to plain-xp code and one warning
says so. Kernels are compiled lazily, at first use (or in ``warmup``), so
importing spmdnet stays fast and never needs a compiler; ``numba.cuda`` is
imported only when a CuPy array first reaches a kernel.

Kernel bodies live in the other modules of this package as plain Python
functions over arrays (what runs under ``NUMBA_DISABLE_JIT=1``) and are
compiled here: ``CpuKernel`` for the CPU (serial, see ``njit_serial``),
``cuda_jit`` for CuPy arrays (``NUMBA_ENABLE_CUDASIM=1`` and
``cuda_simulation()`` run those on the CPU, for tests). ``target`` decides
whether the ops take a kernel; ``compile_seconds`` reports compile time.

Compile cache (``SPMDNET_KERNEL_CACHE=1``, off by default): compiled CPU
kernels are kept in a node-local directory (``cache_dir``, named after a
hash of the kernel sources), and ``compile_in_order`` (called by
``kernels.warmup(comm=...)``) lets rank 0 compile first, then one rank per
other host, then the rest, so that ranks never race writing one cache.
"""
import hashlib
import os
import socket
import tempfile
import warnings

import numpy as np

from .. import config
from ..errors import DistributedError

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
    """Where the ops run kernels for these float arrays: ``"cpu"`` (all
    NumPy), ``"cuda"`` (all CuPy, and numba.cuda usable), or None (the xp
    path): None also when ``SPMDNET_KERNELS=xp``, or the arrays mix types or
    dtypes or are not float32/float64. ``None`` entries are skipped."""
    return array_target(*arrays) if kernels_on() else None


def array_target(*arrays):
    """``target`` without the knob: what the kernel wrappers accept."""
    if numba is None:
        return None
    arrays = [a for a in arrays if a is not None]
    kind, dtype = type(arrays[0]), arrays[0].dtype
    if dtype not in _FLOATS or any(type(a) is not kind or a.dtype != dtype for a in arrays):
        return None
    if kind is np.ndarray:
        return "cuda" if _simulating else "cpu"
    if kind.__module__.startswith("cupy") and cuda_usable():
        return "cuda"
    return None


_simulating = []


class cuda_simulation:  # noqa: N801 - used like a function: with cuda_simulation():
    """For tests: inside ``with cuda_simulation():`` NumPy arrays take the CUDA
    kernels, run by Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` must be
    set before Numba is imported)."""

    def __enter__(self):
        if numba is None or not numba.config.ENABLE_CUDASIM:
            raise RuntimeError("cuda_simulation() needs NUMBA_ENABLE_CUDASIM=1 at import")
        _simulating.append(True)

    def __exit__(self, *exc):
        _simulating.pop()


def check_target(what, *arrays):
    """``array_target`` of the arrays, or TypeError naming what they are."""
    where = array_target(*arrays)
    if where is None:
        kinds = sorted({f"{type(a).__module__}.{type(a).__name__} of {a.dtype}"
                        for a in arrays if a is not None})
        raise TypeError(f"{what} kernels need NumPy (or CuPy) float32 or float64 arrays, "
                        f"all of one kind and dtype, and Numba; got {', '.join(kinds)}")
    return where


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


class CpuKernel:
    """A plain Python kernel body, compiled with ``njit_serial`` at its first
    call (with the disk cache when ``SPMDNET_KERNEL_CACHE=1``); ``.body`` is
    the plain function."""

    def __init__(self, body):
        self.body = body
        self.compiled = None
        self.__name__ = body.__name__
        self.__doc__ = body.__doc__

    def __call__(self, *args):
        fn = self.compiled
        if fn is None:
            fn = self.compiled = njit_serial(self.body, cache=_use_cache())
        return fn(*args)


if numba is not None:  # compile time, kept apart from step times by benchmarks
    _compile_timer = numba.core.event.TimingListener()
    numba.core.event.register("numba:compile", _compile_timer)


def compile_seconds():
    """Seconds this process has spent compiling Numba code (kernels at their
    first call, or in ``kernels.warmup``; loading from the disk cache is not
    compiling)."""
    return _compile_timer.duration if numba is not None and _compile_timer.done else 0.0


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


def launch(kernel, n, *args, stream_of=None, threads=None):
    """Run ``kernel`` over ``n`` work items (1-D grid) on CuPy's current stream,
    128 threads per block (16 under the simulator: each is a Python thread)."""
    if n == 0:
        return
    threads = threads or (16 if numba.config.ENABLE_CUDASIM else 128)
    blocks = (n + threads - 1) // threads
    kernel[blocks, threads, _stream(stream_of)](*args)


def launch_rows(kernel, rows, *args, stream_of=None, threads):
    """Run ``kernel`` with one block of ``threads`` per row (row reductions)."""
    if rows == 0:
        return
    kernel[rows, threads, _stream(stream_of)](*args)


def cupy():
    """The cupy module (kernels see CuPy arrays only when it is loaded)."""
    from ..backend import require_cupy  # noqa: PLC0415 - backend owns the CuPy import
    return require_cupy()


def xp_for(array):
    """numpy or cupy, whichever ``array`` belongs to."""
    return np if type(array) is np.ndarray else cupy()


def _stream(array):
    """CuPy's current stream as a Numba stream (0, the default, when plain)."""
    if array is None or not type(array).__module__.startswith("cupy"):
        return 0
    ptr = cupy().cuda.get_current_stream().ptr
    return cuda().external_stream(ptr) if ptr else 0


# --- compile cache policy for MPI jobs ----------------------------------------------
def cache_dir():
    """Where compiled kernels are kept: under ``SPMDNET_KERNEL_CACHE_DIR``, by
    default a node-local scratch directory ($SLURM_TMPDIR, $TMPDIR or the
    system temporary directory), never the package directory on a shared
    filesystem. The last part names a hash of the kernel sources: Numba
    checks only the timestamp of a kernel's own file, so an upgraded helper
    (special.py, reduce.py) would otherwise load stale machine code."""
    base = config.get("SPMDNET_KERNEL_CACHE_DIR")
    if base is None:
        scratch = os.environ.get("SLURM_TMPDIR") or tempfile.gettempdir()
        user = os.environ.get("USER") or str(os.getuid())
        base = os.path.join(scratch, f"spmdnet-numba-{user}")
    return os.path.join(base, f"kernels-{_sources_hash()}")


_hash = []


def _sources_hash():
    if not _hash:
        digest = hashlib.sha1(numba.__version__.encode() if numba else b"")
        folder = os.path.dirname(os.path.abspath(__file__))
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as f:
                    digest.update(name.encode() + f.read())
        _hash.append(digest.hexdigest()[:12])
    return _hash[0]


def _use_cache():
    """True when the disk cache is on; points Numba at ``cache_dir()`` then
    (Numba's own setting: other cached Numba code in the process goes there too)."""
    if not config.get_bool("SPMDNET_KERNEL_CACHE", False) or jit_disabled():
        return False
    path = cache_dir()
    if numba.config.CACHE_DIR != path:
        os.makedirs(path, exist_ok=True)
        numba.config.CACHE_DIR = path
    return True


def _rank_size(comm):
    rank = comm.Get_rank() if hasattr(comm, "Get_rank") else comm.rank
    size = comm.Get_size() if hasattr(comm, "Get_size") else comm.size
    return rank, size


def compile_in_order(compile_fn, comm=None):
    """Call ``compile_fn()`` on every rank of ``comm`` and return its result.

    ``comm`` is duck-typed (mpi4py-like: ``Get_rank``, ``Get_size``,
    ``allgather``, ``Barrier``; no MPI import here), and every rank of it must
    call this. The ranks gather their host names and cache settings (a
    disagreement raises DistributedError on every rank). With the disk cache
    on they take turns: rank 0 compiles and fills its cache first; then the
    lowest rank of every other host (node-local caches are filled once each;
    a shared one is only read); then all other ranks, which load from the
    cache. Without the cache every rank compiles at once: nothing is shared,
    so nothing can race."""
    if comm is None:
        return compile_fn()
    rank, size = _rank_size(comm)
    if size == 1:
        return compile_fn()
    cached = _use_cache()
    mine = (socket.gethostname(), cached, cache_dir() if cached else None)
    everyone = comm.allgather(mine)
    for other, theirs in enumerate(everyone):
        if theirs[1:] != everyone[0][1:]:
            raise DistributedError(
                f"kernel cache settings differ between ranks: rank 0 has "
                f"SPMDNET_KERNEL_CACHE={int(everyone[0][1])} (directory {everyone[0][2]}), "
                f"rank {other} has SPMDNET_KERNEL_CACHE={int(theirs[1])} (directory "
                f"{theirs[2]})")
    if not cached:
        return compile_fn()
    hosts = [host for host, _, _ in everyone]
    phase = 0 if rank == 0 else (1 if hosts.index(hosts[rank]) == rank else 2)
    result = None
    for turn in range(3):
        if phase == turn:
            result = compile_fn()
        (comm.Barrier if hasattr(comm, "Barrier") else comm.barrier)()
    return result
