"""The embedding's backward: rows of the output gradient added into the
rows of the weight gradient that the indices name (indices may repeat).

One serial pass in index order: the bits of ``np.add.at`` (the plain-xp
reference in ``spmdnet.backend.scatter_add``), on every machine. The CUDA
variant sorts (index, position) pairs and sums each index's rows in
position order: the same bits, where ``cupyx.scatter_add``'s atomics give
an order that changes from run to run.
"""
import numpy as np

from ..backend import xp_of
from ._cpu import CpuKernel
from ._cuda import Builder, launch
from ._target import check_target


def _scatter_rows(out, indices, g):
    """out[indices[i]] += g[i] for i in order."""
    for i in range(indices.shape[0]):
        r = indices[i]
        for j in range(g.shape[1]):
            out[r, j] += g[i, j]


_cpu = {"scatter_rows": CpuKernel(_scatter_rows)}

cuda = None  # numba.cuda, bound by _cuda.Builder (the CUDA simulator swaps this global)


@Builder
def _cuda_kernels():
    def scatter_segments(out, rows, starts, order, g):
        """Thread (segment s, column j): out[rows[s], j] += the g rows of
        segment s (positions order[starts[s]:starts[s + 1]]), in order."""
        k = cuda.grid(1)
        d = g.shape[1]
        if k < rows.shape[0] * d:
            s, j = k // d, k % d
            acc = out[rows[s], j]
            for q in range(starts[s], starts[s + 1]):
                acc += g[order[q], j]
            out[rows[s], j] = acc

    return {"scatter_segments": scatter_segments}


def backward(g, indices, num_embeddings, out=None):
    """The weight gradient (num_embeddings, D) of ``weight[indices]`` given
    its output gradient g (indices.shape + (D,)); written into ``out`` (a
    gradient buffer) when given, else a new array."""
    where = check_target("embedding", g, out)
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
    if where == "cpu":
        _cpu["scatter_rows"](out, xp.ascontiguousarray(idx), g2)
        return out
    n = idx.size
    order = xp.argsort(idx.astype(xp.int64) * n + xp.arange(n))  # unique keys: stable
    ordered = idx[order]
    first = xp.flatnonzero(xp.concatenate([xp.ones(1, bool), ordered[1:] != ordered[:-1]]))
    starts = xp.concatenate([first, xp.asarray([n])]).astype(xp.int64)
    rows = ordered[first].astype(xp.int64)
    launch(_cuda_kernels()["scatter_segments"], rows.size * d, out, rows, starts,
           order.astype(xp.int64), g2, stream_of=g)
    return out


def warmup(dtype):
    """Compile the CPU kernel for ``dtype`` (int64 indices)."""
    backward(np.ones((2, 3), dtype), np.zeros(2, np.int64), 4)
