"""The float32 transforms compiled by Numba: uniforms ``u * (to - from) +
from`` and the blocks-of-16 Box-Muller of PyTorch's vectorised kernel
(Cephes ``logf``/``sincosf``, see ``float32_math``, which runs the same steps
in NumPy when Numba is off), with true float32 fused multiply-adds."""
import numpy as np

from ..kernels._numba import jit_disabled
from . import float32_math as f32
from .compiled import _compiled, _inline, fma

F = np.float32
_ONE, _HALF, _MINUS_TWO, _MANTISSA_SCALE = F(1), F(0.5), F(-2), F(2.0 ** -24)
_L0, _L1, _L2, _L3, _L4, _L5, _L6, _L7, _L8 = f32._LOG_P
_Q1, _Q2, _SQRTHF, _FOPI = f32._LOG_Q1, f32._LOG_Q2, f32._SQRTHF, f32._FOPI
_DP1, _DP2, _DP3 = f32._DP
_C0, _C1, _C2 = f32._COS_P
_S0, _S1, _S2 = f32._SIN_P
_TWO_PI = f32._TWO_PI


@_compiled
def _uniform_float32(bits, low, span):
    out = np.empty(bits.size, np.float32)
    for i in range(bits.size):
        u = np.float32(bits[i] & 0xFFFFFF) * _MANTISSA_SCALE
        out[i] = fma(u, span, low)
    return out


@_inline
def _logf(x, scratch, scratch_bits):
    scratch[0] = x
    bits = scratch_bits[0]
    exponent = np.float32((bits >> 23) - 0x7F) + _ONE
    scratch_bits[0] = (bits & 0x007FFFFF) | 0x3F000000
    m = scratch[0]
    if m < _SQRTHF:
        exponent = exponent - _ONE
        m = (m - _ONE) + m
    else:
        m = m - _ONE
    z = m * m
    y = fma(fma(fma(fma(fma(fma(fma(fma(_L0, m, _L1), m, _L2), m, _L3), m, _L4), m, _L5),
                    m, _L6), m, _L7), m, _L8)
    y = fma(y * m, z, exponent * _Q1)
    y = fma(z, -_HALF, y)
    return fma(exponent, _Q2, m + y)


@_inline
def _sincosf(x):
    """(sin, cos) of 0 <= x (the angles 2 pi u)."""
    j = np.int32(x * _FOPI)
    j = (j + 1) & ~1
    y = np.float32(j)
    x = fma(y, _DP3, fma(y, _DP2, fma(y, _DP1, x)))
    z = x * x
    c = fma(fma(_C0, z, _C1), z, _C2)
    c = fma(c * z, z, -(z * _HALF)) + _ONE
    s = fma(fma(_S0, z, _S1), z, _S2)
    s = fma(s * z, x, x)
    sin, cos = (c, s) if j & 2 else (s, c)
    if j & 4:
        sin = -sin
    if ~(j - 2) & 4:
        cos = -cos
    return sin, cos


@_compiled
def _box_muller_float32(data, mean, std):
    scratch = np.empty(1, np.float32)
    scratch_bits = scratch.view(np.int32)
    for start in range(0, data.size - 15, 16):
        for k in range(8):
            radius = np.sqrt(_MINUS_TWO * _logf(_ONE - data[start + k], scratch, scratch_bits))
            sin, cos = _sincosf(_TWO_PI * data[start + k + 8])
            data[start + k] = fma(radius * cos, std, mean)
            data[start + k + 8] = fma(radius * sin, std, mean)


def uniform_float32(bits, low, span):
    """float32 uniforms on [low, low + span) from raw 32-bit draws."""
    if jit_disabled():
        u = (bits & np.uint64(0xFFFFFF)).astype(F) * _MANTISSA_SCALE
        return f32.fma_float32(u, span, low)
    return _uniform_float32(bits, F(low), F(span))


def box_muller_float32(data, mean, std):
    """Blocks of 16 float32 uniforms in place to normals."""
    if jit_disabled():
        f32.box_muller_float32(data, F(mean), F(std))
    else:
        _box_muller_float32(data, F(mean), F(std))
