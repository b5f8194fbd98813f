"""PyTorch's dtype names as NumPy dtypes, so ``dtype=torch.long`` ports as
``dtype=sn.long``. As in PyTorch, ``float`` is float32 and ``int`` is int32
(``sn.float`` is not Python's float).

NumPy has no bfloat16: ``bfloat16`` is ml_dtypes' NumPy dtype (2 bytes, the
top half of a float32; casts round to nearest even, as PyTorch's). Ops on it
compute in float32 and round their result to bfloat16, as PyTorch's CPU ops
do (``spmdnet/_precision.py``). Its NumPy ``kind`` is ``"V"``, not ``"f"``:
``is_floating(dtype)`` is the test that counts it.

``set_float32_matmul_precision`` / ``get_float32_matmul_precision``: PyTorch's
setting, validated as PyTorch does. It permits, never requires, faster
lower-precision float32 products, and spmdnet (NumPy's and CuPy's float32
GEMMs) always computes at "highest": correct under every setting, as
PyTorch on hardware without such paths.
"""
import warnings

import ml_dtypes
import numpy as np

float16 = half = np.dtype(np.float16)
float32 = np.dtype(np.float32)
float64 = double = np.dtype(np.float64)
complex64 = cfloat = np.dtype(np.complex64)
complex128 = cdouble = np.dtype(np.complex128)
uint8 = np.dtype(np.uint8)
int8 = np.dtype(np.int8)
int16 = short = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = long = np.dtype(np.int64)
bool = np.dtype(np.bool_)  # noqa: A001 - PyTorch's name
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float = float32  # noqa: A001 - PyTorch's name: torch.float is float32
int = int32  # noqa: A001 - PyTorch's name: torch.int is int32

__all__ = ["float16", "half", "float32", "float", "float64", "double", "complex64", "cfloat",
         "complex128", "cdouble", "uint8", "int8", "int16", "short", "int32", "int",
         "int64", "long", "bool", "bfloat16", "set_float32_matmul_precision",
           "get_float32_matmul_precision"]

MATMUL_PRECISIONS = ("highest", "high", "medium")
_matmul_precision = ["highest"]


def is_floating(dtype):
    """True for the floating dtypes, bfloat16 (NumPy kind "V") included."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == bfloat16


def set_float32_matmul_precision(precision):
    """PyTorch's ``torch.set_float32_matmul_precision``: "highest", "high" or
    "medium"; any other string warns with PyTorch's text and changes nothing
    (as PyTorch); not a string: TypeError. See the module docstring."""
    if not isinstance(precision, str):
        raise TypeError(f"set_float32_matmul_precision(): argument 'precision' must be str, "
                        f"not {type(precision).__name__}")
    if precision not in MATMUL_PRECISIONS:
        warnings.warn(f"{precision} is not one of 'highest', 'high', or 'medium'; the current "
                      "setFloat32MatmulPrecision call has no effect.", UserWarning, stacklevel=2)
        return
    _matmul_precision[0] = precision


def get_float32_matmul_precision():
    """The last valid ``set_float32_matmul_precision`` value ("highest" at start)."""
    return _matmul_precision[0]
