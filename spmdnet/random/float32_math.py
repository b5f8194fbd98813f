"""Box-Muller in float32 as PyTorch's vectorised CPU kernel computes it: the
Cephes single-precision ``logf`` and ``sincosf`` (range reduction by pi/4,
minimax polynomials), as published in Julien Pommier's SSE/AVX math
functions, evaluated lane by lane in NumPy float32: the constants, and the
steps ``compiled32`` compiles (this NumPy form runs when Numba is off). A
multiply followed by an add is one fused multiply-add in PyTorch's compiled
kernel (which of two multiplies feeding an add is fused was found by
experiment: with these choices 100000 normals equal PyTorch's bitwise);
``_fma`` here computes it in float64 (the product is exact there), then
rounds to float32 (a double rounding, off in about one case in 2**29;
``compiled32`` uses a true float32 fma)."""
import numpy as np

F = np.float32
_SQRTHF = F(0.707106781186547524)
_LOG_P = [F(c) for c in (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1,
                         -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
                         2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)]
_LOG_Q1, _LOG_Q2 = F(-2.12194440e-4), F(0.693359375)
_FOPI = F(1.27323954473516)  # 4 / pi
_DP = [F(-0.78515625), F(-2.4187564849853515625e-4), F(-3.77489497744594108e-8)]
_COS_P = [F(2.443315711809948e-5), F(-1.388731625493765e-3), F(4.166664568298827e-2)]
_SIN_P = [F(-1.9515295891e-4), F(8.3321608736e-3), F(-1.6666654611e-1)]
_TWO_PI = F(2.0 * np.pi)


def _fma(a, b, c):
    return (a.astype(np.float64) * np.float64(b) + np.asarray(c, np.float64)).astype(F)


fma_float32 = _fma


def logf(x):
    """Cephes logf for positive normal float32 ``x`` (the uniforms' 1 - u)."""
    bits = x.view(np.int32)
    exponent = ((bits >> 23) - 0x7F).astype(F) + F(1)
    m = ((bits & 0x007FFFFF) | 0x3F000000).view(F)  # mantissa in [0.5, 1)
    small = m < _SQRTHF
    exponent = exponent - small.astype(F)
    m = (m - F(1)) + np.where(small, m, F(0))
    z = m * m
    y = np.full_like(m, _LOG_P[0])
    for c in _LOG_P[1:]:
        y = _fma(y, m, c)
    y = _fma(y * m, z, exponent * _LOG_Q1)
    y = _fma(z, F(-0.5), y)
    return _fma(exponent, _LOG_Q2, m + y)


def sincosf(x):
    """Cephes sinf and cosf of float32 ``x`` (here 0 <= x < 2 pi)."""
    sign_sin = np.signbit(x)
    x = np.abs(x)
    j = (x * _FOPI).astype(np.int32)
    j = (j + 1) & ~1
    y = j.astype(F)
    swap_sin = (j & 4) != 0
    use_sin_poly = (j & 2) != 0
    for dp in _DP:
        x = _fma(y, dp, x)
    swap_cos = ((~(j - 2)) & 4) != 0
    sign_sin = sign_sin ^ swap_sin
    z = x * x
    c = np.full_like(x, _COS_P[0])
    for k in _COS_P[1:]:
        c = _fma(c, z, k)
    c = _fma(c * z, z, -(z * F(0.5))) + F(1)
    s = np.full_like(x, _SIN_P[0])
    for k in _SIN_P[1:]:
        s = _fma(s, z, k)
    s = _fma(s * z, x, x)
    sin = np.where(use_sin_poly, c, s)
    cos = np.where(use_sin_poly, s, c)
    return np.where(sign_sin, -sin, sin), np.where(swap_cos, -cos, cos)


def box_muller_float32(data, mean, std):
    """Blocks of 16 float32 uniforms in place to normals (first 8: 1 - u as
    the radius's argument, last 8: the angle)."""
    blocks = data[:data.size // 16 * 16].reshape(-1, 2, 8)
    u1, u2 = F(1) - blocks[:, 0], blocks[:, 1]
    radius = np.sqrt(F(-2) * logf(u1))
    sin, cos = sincosf(_TWO_PI * u2)
    blocks[:, 0] = _fma(radius * cos, std, mean)
    blocks[:, 1] = _fma(radius * sin, std, mean)
