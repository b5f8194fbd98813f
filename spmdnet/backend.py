"""Array backends: NumPy on the CPU, CuPy on a GPU.

This is the only module that imports CuPy. Every piece of array code asks
``xp_of(*arrays)`` for its array module, so one code path serves both backends
(Chainer's ``get_array_module`` habit). CuPy is imported lazily on first need,
so importing spmdnet never needs CUDA.
"""
import numpy as np

from ._meta import MetaArray, meta_array

_cupy = None
_cupy_error = None
_cupy_tried = False


def _load_cupy():
    """Import CuPy once; remember the original ImportError for messages."""
    global _cupy, _cupy_error, _cupy_tried
    if not _cupy_tried:
        _cupy_tried = True
        try:
            import cupy  # noqa: PLC0415 - the one place CuPy is imported
            _cupy = cupy
        except Exception as exc:  # ImportError, or a CUDA driver error
            _cupy_error = exc
    return _cupy


def cupy_available():
    """True when CuPy imports and at least one GPU is visible."""
    cp = _load_cupy()
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def require_cupy():
    """Return the cupy module or raise with the original import error."""
    cp = _load_cupy()
    if cp is None:
        raise ImportError(
            "this needs CuPy (pip install 'spmdnet[gpu]'); importing it failed "
            f"with: {_cupy_error!r}")
    return cp


def is_cupy_array(a):
    """True for a CuPy ndarray, without importing CuPy when it is not loaded."""
    return type(a).__module__.startswith("cupy")


def xp_of(*arrays):
    """The array module (numpy or cupy) of ``arrays``; ``None`` entries and
    Python scalars are ignored. Mixing NumPy and CuPy arrays raises TypeError."""
    kinds = {}
    for a in arrays:
        if a is None or isinstance(a, (int, float, bool, complex, np.generic)):
            continue
        kinds.setdefault(is_cupy_array(a), type(a))
    if len(kinds) > 1:
        raise TypeError(
            "cannot mix NumPy and CuPy arrays in one operation: got "
            f"{kinds[False].__module__}.{kinds[False].__name__} and "
            f"{kinds[True].__module__}.{kinds[True].__name__}; move both to "
            "one device first (spmdnet.backend.to_device)")
    if kinds.get(True) is not None:
        return require_cupy()
    return np


def asnumpy(a):
    """A host NumPy array for ``a`` (a copy only when ``a`` lives on a GPU)."""
    if is_cupy_array(a):
        return a.get()
    if type(a) is MetaArray:  # meta arrays are never subclassed further
        raise NotImplementedError("Cannot copy out of meta tensor; no data! (a tensor on the "
                                  "'meta' device has a shape and a dtype only)")
    return np.asarray(a)


def to_device(a, device):
    """Move an array to ``"cpu"`` or ``"gpu"`` (the current CuPy device), or
    to ``"meta"`` (its shape and dtype only)."""
    if device == "meta":
        return meta_array(a.shape, a.dtype)
    if device == "cpu":
        return asnumpy(a)
    if device == "gpu":
        return require_cupy().asarray(a)
    raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")


def device_of(a):
    """``"gpu"`` for a CuPy array, ``"cpu"`` otherwise."""
    return "gpu" if is_cupy_array(a) else "cpu"


def data_address(a):
    """The address of ``a``'s first element (host or device memory): how
    views of one buffer are placed against each other."""
    return a.data.ptr if is_cupy_array(a) else a.__array_interface__["data"][0]


def sync(*arrays):
    """Wait for the CUDA stream when any array lives on a GPU.

    mpi4py does no stream synchronisation: a device buffer handed to MPI
    before the kernels that fill it have finished is read half-written.
    Collective wrappers call this before every MPI call, so nobody forgets.
    """
    if any(is_cupy_array(a) for a in arrays):
        require_cupy().cuda.get_current_stream().synchronize()


def scatter_add(target, index, values):
    """``target[index] += values`` where repeated indices all add up."""
    if is_cupy_array(target):
        import cupyx  # noqa: PLC0415 - part of CuPy, imported only here
        cupyx.scatter_add(target, index, values)
    else:
        np.add.at(target, index, values)


def erf_gpu(x):
    """The error function on a CuPy array (cupyx.scipy.special.erf)."""
    import cupyx.scipy.special  # noqa: PLC0415 - part of CuPy, imported only here
    return cupyx.scipy.special.erf(x)


def gpu_count():
    """How many CUDA devices CuPy sees (0 without CuPy)."""
    return require_cupy().cuda.runtime.getDeviceCount() if cupy_available() else 0


def use_gpu(index):
    """Make CUDA device ``index`` current for this process."""
    require_cupy().cuda.Device(index).use()


_pinned = {}


def pinned_like(a):
    """A page-locked host NumPy array with a's shape and dtype, reused across
    calls of the same size (host staging of GPU buffers for MPI)."""
    key = (a.shape, str(a.dtype))
    if key not in _pinned:
        cp = require_cupy()
        mem = cp.cuda.alloc_pinned_memory(max(a.nbytes, 1))
        _pinned[key] = np.frombuffer(mem, a.dtype, a.size).reshape(a.shape)
    return _pinned[key]


def upload(host):
    """Copy a host array to the current GPU through pinned memory on a side
    stream (so it overlaps the compute stream); returns when it has arrived."""
    cp = require_cupy()
    mem = cp.cuda.alloc_pinned_memory(max(host.nbytes, 1))
    pinned = np.frombuffer(mem, host.dtype, host.size).reshape(host.shape)
    pinned[...] = host
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        out = cp.asarray(pinned)
    stream.synchronize()
    return out
