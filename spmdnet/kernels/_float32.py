"""float32 fast paths for transcendental functions inside compiled kernels.

Numba calls libm (or CPython's own code, for erf) one element at a time:
2-40 ns per element, 5-100x slower than NumPy's SIMD loops. Kernels call the
plain functions in special.py; for float32 arguments those compile to a
polynomial version in plain arithmetic instead, which LLVM vectorises.
"""
from ._numba import ir, numba


def float32_variant(py_fn, float32_fn):
    """Inside compiled kernels, calls of ``py_fn`` with a float32 argument run
    ``float32_fn``; other calls (and plain Python) run ``py_fn`` itself."""
    if numba is None:
        return

    @numba.extending.overload(py_fn, jit_options={"error_model": "numpy"})
    def _overload(x):
        if isinstance(x, numba.types.Float) and x.bitwidth == 32:
            return float32_fn
        return py_fn


if numba is not None:
    @numba.extending.intrinsic
    def float32_from_bits(typingctx, bits):
        """The float32 whose IEEE bit pattern is the int32 ``bits`` (compiled
        code only: the float32 variants, never plain Python, call it)."""
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.FloatType())
        return numba.types.float32(numba.types.int32), codegen
else:  # pragma: no cover
    float32_from_bits = None
