"""The embedding's backward: rows of the output gradient added into the
rows of the weight gradient that the indices name (indices may repeat).

One serial pass in index order: the bits of ``np.add.at`` (the plain-xp
reference in ``spmdnet.backend.scatter_add``), on every machine.
"""
import numpy as np

from ..backend import xp_of
from ._cpu import CpuKernel
from ._target import check_target


def _scatter_rows(out, indices, g):
    """out[indices[i]] += g[i] for i in order."""
    for i in range(indices.shape[0]):
        r = indices[i]
        for j in range(g.shape[1]):
            out[r, j] += g[i, j]


_scatter_rows_kernel = CpuKernel(_scatter_rows)


def backward(g, indices, num_embeddings, out=None):
    """The weight gradient (num_embeddings, D) of ``weight[indices]`` given
    its output gradient g (indices.shape + (D,)); written into ``out`` (a
    gradient buffer) when given, else a new array."""
    check_target("embedding", g, out)
    d = g.shape[-1] if g.ndim else 0
    if indices.dtype.kind not in "iu" or g.shape != indices.shape + (d,):
        raise ValueError(f"embedding kernels: gradient {g.shape} does not fit integer "
                         f"indices {indices.shape} of {indices.dtype}")
    xp = xp_of(g)
    shape = (num_embeddings, d)
    if out is None:
        out = xp.zeros(shape, g.dtype)
    elif out.shape != shape or not out.flags.c_contiguous:
        raise ValueError(f"embedding kernels: out must be C-contiguous {shape}, got "
                         f"{out.shape}")
    else:
        out[...] = 0
    idx = indices.reshape(-1)
    if idx.size == 0 or d == 0:
        return out
    if int(idx.min()) < 0 or int(idx.max()) >= num_embeddings:
        raise ValueError(f"embedding kernels: index out of range [0, {num_embeddings})")
    g2 = xp.ascontiguousarray(g).reshape(-1, d)
    _scatter_rows_kernel(out, xp.ascontiguousarray(idx), g2)
    return out


def warmup(dtype):
    """Compile the CPU kernel for ``dtype`` (int64 indices)."""
    backward(np.ones((2, 3), dtype), np.zeros(2, np.int64), 4)
