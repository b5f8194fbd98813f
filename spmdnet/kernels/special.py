"""Special functions: the scalar ``exp`` and ``erf`` that kernels call,
and ``erf_array``, the error function in plain xp (the exact GELU's xp path).

The scalar functions are plain Python over ``math`` (the reference, and what
runs under ``NUMBA_DISABLE_JIT=1``). Inside compiled kernels a float32
argument takes the polynomial variants below instead: Numba would call libm
(or CPython's erf) one element at a time, 2-40 ns per element, while these
are plain arithmetic that LLVM vectorises (about 0.5 ns per element).
Accuracy against the float64 functions, on the inputs of tests/test_kernels_numerics.py:
exp 2 ulp (but 0 instead of subnormal results, below 1.2e-38), erf 7 ulp
(relative error < 1e-6). float64 arguments always use ``math``.
``erf_array`` uses no Numba: W. J. Cody's rational approximations in xp
operations, within 4 ulp of ``math.erf`` in float64 (CuPy arrays take
``cupyx.scipy.special.erf``).
"""
import math

import numpy as np

from ..backend import erf_gpu, is_cupy_array, xp_of
from ._float32 import float32_from_bits, float32_variant

_EXP_MAX = 709.782712893384  # math.exp raises OverflowError above this


def exp(x):
    """e**x for kernels (inf above the float64 range, as NumPy)."""
    return math.inf if x > _EXP_MAX else math.exp(x)


def erf(x):
    """The error function for kernels (see ``erf_array`` for arrays)."""
    return math.erf(x)


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
    scale1 = float32_from_bits((half + np.int32(127)) << np.int32(23))
    scale2 = float32_from_bits((k - half + np.int32(127)) << np.int32(23))
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


float32_variant(exp, _exp_float32)
float32_variant(erf, _erf_float32)


# erf on arrays: W. J. Cody, "Rational Chebyshev approximations for the error
# function", Math. Comp. 23 (1969), as in his SPECFUN routine CALERF. erf(x)
# for |x| <= 0.46875; erfc(|x|) for 0.46875 < |x| <= 4 and above 4 (where
# erfc(x) = e**-x**2 / x * (1/sqrt(pi) + R(1/x**2) / x**2)); erf = 1 - erfc.
_CODY_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
           3.20937758913846947e03, 1.85777706184603153e-1)
_CODY_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
           2.84423683343917062e03)
_CODY_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
           2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
           2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_CODY_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
           1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
           3.43936767414372164e03, 1.23033935480374942e03)
_CODY_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
           1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_CODY_Q = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1,
           6.05183413124413191e-2, 2.33520497626869185e-3)
_INV_SQRT_PI = 5.6418958354775628695e-1


def _ratio(t, num, den):
    """Cody's rational function of t: num[-1] leads, num[-2] and den[-1] close."""
    p, q = num[-1] * t, t
    for a, b in zip(num[:-2], den[:-1]):
        p, q = (p + a) * t, (q + b) * t
    return (p + num[-2]) / (q + den[-1])


def erf_array(x):
    """The error function elementwise, on NumPy or CuPy arrays, keeping
    dtype (computed in float64). Plain xp: no Numba."""
    if is_cupy_array(x):
        return erf_gpu(x)
    xp = xp_of(x)
    x64 = xp.asarray(x, dtype=xp.float64)
    y = xp.minimum(xp.abs(x64), 6.0)  # erf rounds to 1 beyond 6; NaN stays NaN
    small = x64 * _ratio(y * y, _CODY_A, _CODY_B)
    middle = _ratio(y, _CODY_C, _CODY_D)
    yb = xp.maximum(y, 4.0)
    z = 1.0 / (yb * yb)
    tail = (_INV_SQRT_PI - z * _ratio(z, _CODY_P, _CODY_Q)) / yb
    y16 = xp.trunc(y * 16.0) / 16.0  # e**-y**2 in two factors, for accuracy
    erfc = xp.exp(-y16 * y16) * xp.exp(-(y - y16) * (y + y16)) \
        * xp.where(y <= 4.0, middle, tail)
    big = (0.5 - erfc) + 0.5
    out = xp.where(y <= 0.46875, small, xp.where(x64 < 0, -big, big))
    return out.astype(x.dtype, copy=False)
