"""Which kernels (CPU or CUDA) arrays can take, whatever the policy says."""
import numpy as np

from ..backend import is_cupy_array
from ._cuda import cuda_usable, simulated
from ._numba import numba

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def array_target(*arrays):
    """``"cpu"`` (all NumPy), ``"cuda"`` (all CuPy, and numba.cuda usable;
    NumPy arrays inside ``cuda_simulation()``) or None: None also when Numba
    is missing, or the arrays mix types or dtypes or are not float32/float64.
    ``None`` entries are skipped."""
    if numba is None:
        return None
    arrays = [a for a in arrays if a is not None]
    kind, dtype = type(arrays[0]), arrays[0].dtype
    if dtype not in _FLOATS or any(type(a) is not kind or a.dtype != dtype for a in arrays):
        return None
    if kind is np.ndarray:
        return "cuda" if simulated() else "cpu"
    if is_cupy_array(arrays[0]) and cuda_usable():
        return "cuda"
    return None


def check_target(what, *arrays):
    """``array_target`` of the arrays, or TypeError naming what they are
    (the kernel wrappers' check)."""
    where = array_target(*arrays)
    if where is None:
        kinds = sorted({f"{type(a).__module__}.{type(a).__name__} of {a.dtype}"
                        for a in arrays if a is not None})
        raise TypeError(f"{what} kernels need NumPy (or CuPy) float32 or float64 arrays, "
                        f"all of one kind and dtype, and Numba; got {', '.join(kinds)}")
    return where
