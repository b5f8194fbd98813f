"""Attention dropout on a GPU: element (n, i, j) of the (N, L, S)
probabilities is kept when the first word of Philox4x32-10 at counter
n*L*S + i*S + j is at least ``threshold(p)``. ``philox`` is one plain body,
run on CuPy (or NumPy) arrays by ``dropout_keep``, so forward and backward
regenerate the same mask instead of storing it. On the CPU the op draws
PyTorch's mask instead (MT19937, stored as bits), so no compiled kernel is
left here. The op is ``spmdnet.ops.attention.ScaledDotProductAttention``.

Row-at-a-time attention kernels (flash-attention style, no BLAS) measured
1.2x (T=64) to 11x (T=1024) slower than the op's row-blocked xp path and
were removed.
"""
import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
LOW, S32 = np.uint64(0xFFFFFFFF), np.uint64(32)


def philox(index, k0, k1):
    """The first 32-bit word of Philox4x32-10 at counter (index's low and
    high words, 0, 0) with key (k0, k1); uint64 scalars or arrays."""
    c0, c1 = index & LOW, index >> S32
    c2 = c3 = c0 ^ c0
    for _ in range(10):
        p0, p1 = c0 * M0, c2 * M1
        c0, c1, c2, c3 = (p1 >> S32) ^ c1 ^ k0, p1 & LOW, (p0 >> S32) ^ c3 ^ k1, p0 & LOW
        k0, k1 = (k0 + W0) & LOW, (k1 + W1) & LOW
    return c0


def keys(seed):
    """Philox's key words from a 64-bit seed."""
    return np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)


def threshold(p):
    """Words below this are dropped: probability p (1.0 drops everything)."""
    return np.uint64(min(round(p * 2.0**32), 2**32))


def dropout_keep(xp, shape, rows, seed, p):
    """The bool keep mask of rows ``rows`` (a range) of the (N, L, S) probabilities."""
    n, length, source = shape
    u = np.uint64
    index = ((xp.arange(n, dtype=u)[:, None, None] * u(length)
              + xp.arange(rows.start, rows.stop, dtype=u)[None, :, None]) * u(source)
             + xp.arange(source, dtype=u))
    k0, k1 = keys(seed)
    return philox(index, k0, k1) >= threshold(p)
