"""CUDA kernels for CuPy arrays: the lazy numba.cuda import, one cached
builder used by every kernel module, and the launches on CuPy's stream.

A module's CUDA kernels are plain functions defined inside a build function
decorated with ``Builder``; they call ``cuda.grid`` and the like through the
module's global ``cuda``, which the builder binds to ``numba.cuda`` when it
first builds them (a global, not a closure variable: the CUDA simulator,
``NUMBA_ENABLE_CUDASIM=1``, swaps that global for its fake module in every
simulated thread). ``cuda_simulation()`` lets tests run them on NumPy arrays.
"""
from ..backend import is_cupy_array, require_cupy
from ._numba import numba, simulating_cuda, warn_once

_cuda = []


def cuda():
    """The ``numba.cuda`` module, imported at first need (about 0.8 s)."""
    if not _cuda:
        import numba.cuda as cuda_module  # noqa: PLC0415 - lazy: a costly import
        _cuda.append(cuda_module)
    return _cuda[0]


_usable = []


def cuda_usable():
    """True when numba.cuda can launch kernels (a GPU, or the simulator);
    otherwise CuPy arrays take the plain CuPy paths, and one warning says why."""
    if not _usable:
        try:
            ok, why = bool(cuda().is_available()), "no CUDA device or driver found"
        except Exception as exc:  # a broken CUDA installation
            ok, why = False, repr(exc)
        _usable.append(ok)
        if not ok:
            warn_once("cuda", f"numba.cuda is unusable ({why}); CuPy arrays take the "
                              "plain CuPy code paths")
    return _usable[0]


class Builder:
    """The CUDA kernels of one module, built once, at their first use.

    ``build()`` defines kernel bodies and returns them by name; calling the
    Builder imports numba.cuda, binds it to the global ``cuda`` of build's
    module and returns the bodies compiled with ``cuda.jit`` (with
    ``device=True``: device functions that other kernels call)."""

    def __init__(self, build, device=False):
        self.build, self.device, self.built = build, device, None

    def __call__(self):
        if self.built is None:
            module = cuda()
            self.build.__globals__["cuda"] = module
            self.built = {name: module.jit(fn, device=self.device)
                          for name, fn in self.build().items()}
        return self.built


def threads_per_block():
    """128, or 16 under the simulator (each thread is a Python thread)."""
    return 16 if simulating_cuda() else 128


def launch(kernel, n, *args, stream_of=None):
    """Run ``kernel`` over ``n`` work items (1-D grid) on CuPy's current stream."""
    if n == 0:
        return
    threads = threads_per_block()
    kernel[(n + threads - 1) // threads, threads, _stream(stream_of)](*args)


def launch_rows(kernel, rows, *args, stream_of=None):
    """Run ``kernel`` with one block of ``threads_per_block()`` threads per
    row (row reductions)."""
    if rows == 0:
        return
    kernel[rows, threads_per_block(), _stream(stream_of)](*args)


def _stream(array):
    """CuPy's current stream as a Numba stream (0, the default, when plain)."""
    if array is None or not is_cupy_array(array):
        return 0
    ptr = require_cupy().cuda.get_current_stream().ptr
    return cuda().external_stream(ptr) if ptr else 0


_simulating = []


def simulated():
    """True inside ``cuda_simulation()``: NumPy arrays take the CUDA kernels."""
    return bool(_simulating)


class cuda_simulation:  # noqa: N801 - used like a function: with cuda_simulation():
    """For tests: inside ``with cuda_simulation():`` NumPy arrays take the CUDA
    kernels, run by Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` must be
    set before Numba is imported)."""

    def __enter__(self):
        if numba is None or not simulating_cuda():
            raise RuntimeError("cuda_simulation() needs NUMBA_ENABLE_CUDASIM=1 at import")
        _simulating.append(True)

    def __exit__(self, *exc):
        _simulating.pop()
