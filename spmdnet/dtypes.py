"""PyTorch's dtype names as NumPy dtypes, so ``dtype=torch.long`` ports as
``dtype=sn.long``. As in PyTorch, ``float`` is float32 and ``int`` is int32
(``sn.float`` is not Python's float). There is no bfloat16 in NumPy."""
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
float = float32  # noqa: A001 - PyTorch's name: torch.float is float32
int = int32  # noqa: A001 - PyTorch's name: torch.int is int32

__all__ = ["float16", "half", "float32", "float", "float64", "double", "complex64", "cfloat",
         "complex128", "cdouble", "uint8", "int8", "int16", "short", "int32", "int",
         "int64", "long", "bool"]
