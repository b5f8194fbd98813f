"""The loops of the sampling transforms, compiled by Numba so they
call the C library's ``log``/``log1p``/``exp``/``cos``/``sin``/``tan`` and a
true fused multiply-add, as PyTorch's kernels do (NumPy's own vectorised
``log1p``, ``exp`` and ``tan`` differ from libm in the last bit now and then).
Without Numba (or with ``NUMBA_DISABLE_JIT=1``) the same loops run in Python
on ``math`` (libm) with an exact rational fused multiply-add: correct, slow."""
import math
from fractions import Fraction

import numpy as np

from ..kernels._cpu import CpuKernel
from ..kernels._numba import jit_disabled, njit_inline, numba

TWO_PI = 2.0 * math.pi


def _exact_fma(a, b, c):
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        return a * b + c
    return float(Fraction(a) * Fraction(b) + Fraction(c))


# Entry kernels compile at their first call, through the kernel cache
# (kernels/_cpu.py); helpers they call are inlined into them.
_compiled = CpuKernel
_inline = njit_inline

if jit_disabled():
    fma = _exact_fma
else:
    @numba.extending.intrinsic
    def _fma_intrinsic(typingctx, a, b, c):
        """LLVM's fma: float32 when all three are float32, else float64."""
        kind = numba.types.float32 if a == b == c == numba.types.float32 \
            else numba.types.float64

        def codegen(context, builder, signature, args):
            args = [context.cast(builder, v, t, kind) for v, t in zip(args, signature.args)]
            return builder.fma(*args)
        return kind(a, b, c), codegen

    def fma(a, b, c):  # pragma: no cover - replaced in compiled code
        return _exact_fma(a, b, c)

    @numba.extending.overload(fma)
    def _fma_overload(a, b, c):
        return lambda a, b, c: _fma_intrinsic(a, b, c)


@_compiled
def fma_array(x, scale, shift):
    """``fma(x, scale, shift)`` elementwise (float64, new array)."""
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = fma(x[i], scale, shift)
    return out


@_compiled
def box_muller_float64(data, mean, std):
    """Blocks of 16 uniforms in place to normals (the first 8 give radii
    from 1 - u, the last 8 angles)."""
    for start in range(0, data.size - 15, 16):
        for j in range(8):
            radius = math.sqrt(-2.0 * math.log(1.0 - data[start + j]))
            theta = TWO_PI * data[start + j + 8]
            data[start + j] = fma(radius * math.cos(theta), std, mean)
            data[start + j + 8] = fma(radius * math.sin(theta), std, mean)


@_compiled
def box_muller_pairs(u, mean, std):
    """Normals from pairs (u1, u2) of uniforms: ``r cos(2 pi u1)`` then
    ``r sin(2 pi u1)``, both scaled and shifted, ``r = sqrt(-2 log1p(-u2))``;
    one more value at the end: the last sine unscaled (PyTorch caches that
    and scales it when it is used)."""
    pairs = u.size // 2
    out = np.empty(2 * pairs + 1)
    for k in range(pairs):
        radius = math.sqrt(-2.0 * math.log1p(-u[2 * k + 1]))
        theta = TWO_PI * u[2 * k]
        out[2 * k] = fma(radius * math.cos(theta), std, mean)
        out[2 * pairs] = radius * math.sin(theta)
        out[2 * k + 1] = fma(out[2 * pairs], std, mean)
    return out


@_compiled
def scaled_log1p_neg(u, scale):
    """``scale * log1p(-u)`` elementwise."""
    out = np.empty_like(u)
    for i in range(u.size):
        out[i] = scale * math.log1p(-u[i])
    return out


@_compiled
def log_array(u):
    out = np.empty_like(u)
    for i in range(u.size):
        out[i] = math.log(u[i])
    return out


@_compiled
def exp_array(x):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = math.exp(x[i])
    return out


@_compiled
def cauchy_array(u, median, sigma):
    """``median + sigma * tan(pi * (u - 0.5))`` elementwise."""
    out = np.empty_like(u)
    for i in range(u.size):
        out[i] = fma(sigma, math.tan(math.pi * (u[i] - 0.5)), median)
    return out


@_compiled
def fisher_yates(perm, draws):
    """PyTorch's randperm shuffle: swap i with i + draws[i] % (n - i)."""
    n = perm.size
    for i in range(n - 1):
        z = i + draws[i] % (n - i)
        perm[i], perm[z] = perm[z], perm[i]


@_compiled
def uniform_float64(draws64):
    """[0, 1) from the low 53 bits of 64-bit draws."""
    out = np.empty(draws64.size, np.float64)
    for i in range(out.size):
        out[i] = np.float64(draws64[i] & np.uint64(0x1FFFFFFFFFFFFF)) * 1.1102230246251565e-16
    return out
