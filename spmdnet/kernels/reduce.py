"""Row reductions for kernels: sum, dot and max along one row of a 2-D array,
with eight interleaved partial results combined in a fixed order.

A plain ``for`` loop adding into one scalar is a chain of dependent adds
(4 cycles each) that LLVM may not reorder without fast-math; eight
independent partial sums vectorise, and their fixed order gives the same
bits on every machine, thread count and rank.
"""
from ._numba import njit_inline


@njit_inline
def row_sum(a, i, zero):
    """sum(a[i, :]) (``zero`` is 0 in a's dtype)."""
    n = a.shape[1]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
    end = n - n % 8
    for j in range(0, end, 8):
        s0 += a[i, j]
        s1 += a[i, j + 1]
        s2 += a[i, j + 2]
        s3 += a[i, j + 3]
        s4 += a[i, j + 4]
        s5 += a[i, j + 5]
        s6 += a[i, j + 6]
        s7 += a[i, j + 7]
    for j in range(end, n):
        s0 += a[i, j]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@njit_inline
def row_dot(a, i, b, k, zero):
    """sum(a[i, :] * b[k, :])."""
    n = a.shape[1]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
    end = n - n % 8
    for j in range(0, end, 8):
        s0 += a[i, j] * b[k, j]
        s1 += a[i, j + 1] * b[k, j + 1]
        s2 += a[i, j + 2] * b[k, j + 2]
        s3 += a[i, j + 3] * b[k, j + 3]
        s4 += a[i, j + 4] * b[k, j + 4]
        s5 += a[i, j + 5] * b[k, j + 5]
        s6 += a[i, j + 6] * b[k, j + 6]
        s7 += a[i, j + 7] * b[k, j + 7]
    for j in range(end, n):
        s0 += a[i, j] * b[k, j]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@njit_inline
def _bigger(m, v):
    return v if v > m else m


@njit_inline
def row_max(a, i, neg_inf):
    """max(a[i, :]) over the non-NaN entries (``neg_inf``, -inf in a's dtype,
    for an all-NaN row): a NaN reaches the callers' results through their
    other uses of the row."""
    n = a.shape[1]
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = neg_inf
    end = n - n % 8
    for j in range(0, end, 8):
        m0 = _bigger(m0, a[i, j])
        m1 = _bigger(m1, a[i, j + 1])
        m2 = _bigger(m2, a[i, j + 2])
        m3 = _bigger(m3, a[i, j + 3])
        m4 = _bigger(m4, a[i, j + 4])
        m5 = _bigger(m5, a[i, j + 5])
        m6 = _bigger(m6, a[i, j + 6])
        m7 = _bigger(m7, a[i, j + 7])
    for j in range(end, n):
        m0 = _bigger(m0, a[i, j])
    return _bigger(_bigger(_bigger(m0, m1), _bigger(m2, m3)),
                   _bigger(_bigger(m4, m5), _bigger(m6, m7)))


def rows(xp, a):
    """``a`` as a C-contiguous 2-D array (rows, last axis), a view when
    possible (a 0-d array: one row of one): what the row kernels take."""
    a = a if a.flags.c_contiguous else xp.ascontiguousarray(a)
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)
