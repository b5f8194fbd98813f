"""Special functions NumPy lacks (erf, for the exact GELU)."""
import math

import numpy as np

from ..backend import erf_gpu, is_cupy_array
from . import _jit

_compiled = {}


def _erf_scalar(x):
    return math.erf(x)


def _erf_cpu():
    if "erf" not in _compiled:
        if _jit.available():
            _compiled["erf"] = _jit.vectorize(["float32(float32)", "float64(float64)"],
                                              _erf_scalar)
        else:
            _compiled["erf"] = np.vectorize(math.erf, otypes=[np.float64])
    return _compiled["erf"]


def erf(x):
    """The error function elementwise, on NumPy or CuPy arrays, keeping dtype."""
    if is_cupy_array(x):
        return erf_gpu(x)
    return _erf_cpu()(x).astype(x.dtype, copy=False)
