"""Special functions: ``erf`` on arrays (for the exact GELU), and the scalar
``exp``, ``erf``, ``tanh`` that kernels call.

The scalar functions are plain Python over ``math`` (the reference, and what
runs under ``NUMBA_DISABLE_JIT=1``). Inside compiled kernels a float32
argument takes the polynomial variants below instead: Numba would call libm
(or CPython's erf) one element at a time, 2-40 ns per element, while these
are plain arithmetic that LLVM vectorises (about 0.5 ns per element).
Accuracy against the float64 functions, on the inputs of tests/test_kernels.py:
exp 2 ulp (but 0 instead of subnormal results, below 1.2e-38), erf and tanh
7 ulp (relative error < 1e-6). float64 arguments always use ``math``.
"""
import math

import numpy as np

from ..backend import erf_gpu, is_cupy_array
from . import _jit

_EXP_MAX = 709.782712893384  # math.exp raises OverflowError above this


def exp(x):
    """e**x for kernels (inf above the float64 range, as NumPy)."""
    return math.inf if x > _EXP_MAX else math.exp(x)


def erf(x):
    """The error function for kernels (see ``erf_array`` for arrays)."""
    return math.erf(x)


def tanh(x):
    """tanh for kernels."""
    return math.tanh(x)


_f = np.float32
# exp: Cephes expf. x = n ln2 + r with |r| <= ln2/2; e**r by a degree-6
# polynomial; 2**n from its bit pattern, in two factors so that n = 128
# still works. Results below the smallest normal float32 are flushed to 0:
# computing subnormals costs a microcode assist per element (100x slower).
_LOG2E, _LN2_HI, _LN2_LO = _f(1.44269504088896341), _f(0.693359375), _f(-2.12194440e-4)
_ROUND = _f(12582912.0)  # 1.5 * 2**23: x + _ROUND - _ROUND rounds x to an integer
_E0, _E1, _E2 = _f(1.9875691500e-4), _f(1.3981999507e-3), _f(8.3334519073e-3)
_E3, _E4, _E5 = _f(4.1665795894e-2), _f(1.6666665459e-1), _f(5.0000001201e-1)


def _exp_float32(x):
    xc = x if x < _f(88.8) else _f(88.8)  # beyond: the result overflows to inf anyway
    xc = xc if xc > _f(-87.5) else _f(-87.5)  # below: 0, set after
    n = (xc * _LOG2E + _ROUND) - _ROUND
    r = xc - n * _LN2_HI - n * _LN2_LO
    y = (((((_E0 * r + _E1) * r + _E2) * r + _E3) * r + _E4) * r + _E5) * (r * r) + r + _f(1)
    k = np.int32(n)
    half = k >> np.int32(1)
    scale1 = _jit.float32_from_bits((half + np.int32(127)) << np.int32(23))
    scale2 = _jit.float32_from_bits((k - half + np.int32(127)) << np.int32(23))
    out = y * scale1 * scale2
    out = out if x > _f(-87.33654) else _f(0)  # e**-87.33654 = 2**-126
    return out if x == x else x


# erf: Eigen's float32 rational approximation (odd degree-13 over even
# degree-8) on [-4, 4]; |erf(x)| rounds to 1 beyond.
_A1, _A3, _A5 = _f(-1.60960333262415e-02), _f(-2.95459980854025e-03), _f(-7.34990630326855e-04)
_A7, _A9 = _f(-5.69250639462346e-05), _f(-2.10102402082508e-06)
_A11, _A13 = _f(2.77068142495902e-08), _f(-2.72614225801306e-10)
_B0, _B2, _B4 = _f(-1.42647390514189e-02), _f(-7.37332916720468e-03), _f(-1.68282697438203e-03)
_B6, _B8 = _f(-2.13374055278905e-04), _f(-1.45660718464996e-05)


def _erf_float32(x):
    xc = x if x < _f(4) else _f(4)
    xc = xc if xc > _f(-4) else _f(-4)
    x2 = xc * xc
    p = ((((((_A13 * x2 + _A11) * x2 + _A9) * x2 + _A7) * x2 + _A5) * x2 + _A3) * x2 + _A1) * xc
    q = (((_B8 * x2 + _B6) * x2 + _B4) * x2 + _B2) * x2 + _B0
    out = p / q
    return out if x == x else x


# tanh: Eigen's float32 rational approximation (odd degree-13 over even
# degree-6) on [-7.9, 7.9]; tanh(x) = x for |x| < 4e-4 to keep tiny inputs
# exact. Its error near +-1 is 7 ulp of 1: where 1 + tanh(x) matters, the
# kernels use exp instead (activation.py).
_T1, _T3, _T5 = _f(4.89352455891786e-03), _f(6.37261928875436e-04), _f(1.48572235717979e-05)
_T7, _T9 = _f(5.12229709037114e-08), _f(-8.60467152213735e-11)
_T11, _T13 = _f(2.00018790482477e-13), _f(-2.76076847742355e-16)
_U0, _U2 = _f(4.89352518554385e-03), _f(2.26843463243900e-03)
_U4, _U6 = _f(1.18534705686654e-04), _f(1.19825839466702e-06)


_TANH_CLAMP = _f(7.90531110763549805)


def _tanh_float32(x):
    xc = x if x < _TANH_CLAMP else _TANH_CLAMP
    xc = xc if xc > -_TANH_CLAMP else -_TANH_CLAMP
    x2 = xc * xc
    p = ((((((_T13 * x2 + _T11) * x2 + _T9) * x2 + _T7) * x2 + _T5) * x2 + _T3) * x2 + _T1) * xc
    q = ((_U6 * x2 + _U4) * x2 + _U2) * x2 + _U0
    out = p / q
    out = x if abs(x) < _f(0.0004) else out
    return out if x == x else x


_jit.float32_variant(exp, _exp_float32)
_jit.float32_variant(erf, _erf_float32)
_jit.float32_variant(tanh, _tanh_float32)

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


def erf_array(x):
    """The error function elementwise, on NumPy or CuPy arrays, keeping dtype.
    (The plain-xp reference path; kernels use the scalar ``erf``.)"""
    if is_cupy_array(x):
        return erf_gpu(x)
    return _erf_cpu()(x).astype(x.dtype, copy=False)
