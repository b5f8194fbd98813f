"""Which arrays a kernel takes, whatever the policy says."""
import numpy as np

from ._numba import numba

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def array_target(*arrays):
    """``"cpu"`` when all arrays are NumPy arrays of one dtype, float32 or
    float64, and Numba imported; otherwise None (CuPy arrays among them:
    CuPy's own code runs). ``None`` entries are skipped."""
    if numba is None:
        return None
    arrays = [a for a in arrays if a is not None]
    dtype = arrays[0].dtype
    if dtype not in _FLOATS or any(type(a) is not np.ndarray or a.dtype != dtype
                                   for a in arrays):
        return None
    return "cpu"


def check_target(what, *arrays):
    """Nothing when the kernels take these arrays (``array_target``), else
    TypeError naming what they are (the kernel wrappers' check)."""
    if array_target(*arrays) is None:
        kinds = sorted({f"{type(a).__module__}.{type(a).__name__} of {a.dtype}"
                        for a in arrays if a is not None})
        raise TypeError(f"{what} kernels need NumPy float32 or float64 arrays, all of one "
                        f"dtype, and Numba; got {', '.join(kinds)}")
