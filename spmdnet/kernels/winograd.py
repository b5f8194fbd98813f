"""Winograd F(2x2, 3x3) for ``ops.conv``'s stride-1 3x3 convolutions (no
dilation, one group, at least ``dispatch.WINOGRAD_MIN_CHANNELS`` channels):
forward, input gradient and weight gradient, each a batch of 16 GEMMs with
2.25x fewer multiply-adds than the columns' GEMM, and no columns.

The output is cut into 2x2 tiles; tile t reads the 4x4 patch d of the
padded input under it (patches overlap by two rows and columns), and

    y_t = Aᵀ [ (G w Gᵀ) ⊙ (Bᵀ d_t B) ] A          (per output/input channel pair)

with Bᵀ (4x4), G (4x3) and Aᵀ (2x4) the constant matrices below. Summed
over channels, each of the 16 positions (k) of the 4x4 transformed tile is a
GEMM: M[k] (O, T) = U[k] (O, C) @ V[k] (C, T), U = G w Gᵀ, V = Bᵀ d B for
the T tiles. The backward is the adjoint of each linear step: dM = A g_t Aᵀ
(``_grad_transform``), dU[k] = dM[k] @ V[k]ᵀ, dw = Gᵀ dU G; dV[k] = U[k]ᵀ @
dM[k], and each patch's B dV Bᵀ added back into the padded input
(``_input_grad``): the gradients are exact for what the forward computed.

Blocks: V and M are 4x the input and output. Written out whole they made
every transform a pass through memory (the transforms then took longer than
the GEMMs); so forward and backward run a block of whole images at a time
(``BLOCK_TILES``), whose V, M and GEMM operands stay in L2, and the input is
saved instead of V (its transform is computed again in backward: less
memory and faster than reading V back). The compiled kernels run along
1-D rows of C-contiguous buffers (no index wraparound test: they vectorise);
the GEMMs stay with BLAS.

Rounding: the transforms add and subtract inputs (and quarter weights)
before the products, so float32 results differ from the direct sum by
rounding of the inputs' magnitude (tests: within 2e-6 of the largest value
on a 16-channel layer); ``SPMDNET_KERNELS=xp`` and CuPy arrays keep the
columns' GEMM.
"""
import numpy as np

from ._cpu import CpuKernel
from ._target import check_target

# The transform matrices of F(2x2, 3x3) (Lavin and Gray, 2015)
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
# G w Gᵀ for all (o, c) at once: (G ⊗ G) (16, 9) times w flattened (9,); exact
# in float32 (entries 0, ±1/4, ±1/2, 1)
GG = np.kron(G, G)

# Tiles per block of images in forward and backward: V, M (16·(C+O) values a
# tile) and the GEMMs' operands stay in this core's 512 KiB L2 at 16 channels
BLOCK_TILES = 256


def _input_transform(x, v, cols, plane, rows, geom):
    """v[4k + l, c·cols + tile] = (Bᵀ d B)[k, l] for every tile's 4x4 patch
    d of the zero-padded plane of x[n, c]."""
    top, left = geom
    batch, channels, h, w = x.shape
    tiles_h, tiles_w = (plane.shape[0] - 2) // 2, (plane.shape[1] - 2) // 2
    width = plane.shape[1]
    # the border stays zero: every (n, c) rewrites the same interior
    for r in range(plane.shape[0]):
        for s in range(width):
            plane[r, s] = 0
    for n in range(batch):
        for c in range(channels):
            for r in range(h):
                src, dest = x[n, c, r], plane[top + r, left:]
                for s in range(w):
                    dest[s] = src[s]
            for a in range(tiles_h):
                d0, d1 = plane[2 * a], plane[2 * a + 1]
                d2, d3 = plane[2 * a + 2], plane[2 * a + 3]
                r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
                for s in range(width):  # Bᵀ d: the rows of every patch at once
                    r0[s] = d0[s] - d2[s]
                    r1[s] = d1[s] + d2[s]
                    r2[s] = d2[s] - d1[s]
                    r3[s] = d1[s] - d3[s]
                at = c * cols + (n * tiles_h + a) * tiles_w
                for k in range(4):  # (Bᵀ d) B: the columns, per tile
                    row = rows[k]
                    # 1-D rows of C-contiguous buffers: unit strides known to
                    # LLVM, no index wraparound test: the loop vectorises
                    out0, out1 = v[4 * k, at:], v[4 * k + 1, at:]
                    out2, out3 = v[4 * k + 2, at:], v[4 * k + 3, at:]
                    for b in range(tiles_w):
                        e0, e1 = row[2 * b], row[2 * b + 1]
                        e2, e3 = row[2 * b + 2], row[2 * b + 3]
                        out0[b] = e0 - e2
                        out1[b] = e1 + e2
                        out2[b] = e2 - e1
                        out3[b] = e1 - e3


def _output_transform(m, cols, bias, out, sums, rows):
    """out[n, o] = bias[o] + Aᵀ m_t A for every tile t, cut to (Ho, Wo)."""
    batch, channels, ho, wo = out.shape
    tiles_h, tiles_w = (ho + 1) // 2, (wo + 1) // 2
    for n in range(batch):
        for o in range(channels):
            b0 = bias[o]
            for a in range(tiles_h):
                at = o * cols + (n * tiles_h + a) * tiles_w
                for col in range(4):  # Aᵀ m: rows 0 and 1, this column of every tile
                    m0, m1 = m[col, at:], m[4 + col, at:]
                    m2, m3 = m[8 + col, at:], m[12 + col, at:]
                    upper, lower = sums[col], sums[4 + col]
                    for b in range(tiles_w):
                        upper[b] = m0[b] + m1[b] + m2[b]
                        lower[b] = m1[b] - m2[b] - m3[b]
                for i in range(2):  # (Aᵀ m) A: output row 2a + i
                    s0, s1 = sums[4 * i], sums[4 * i + 1]
                    s2, s3 = sums[4 * i + 2], sums[4 * i + 3]
                    dest = rows[i]
                    for b in range(tiles_w):
                        dest[2 * b] = b0 + (s0[b] + s1[b] + s2[b])
                        dest[2 * b + 1] = b0 + (s1[b] - s2[b] - s3[b])
                for i in range(min(2, ho - 2 * a)):
                    src, dest = rows[i], out[n, o, 2 * a + i]
                    for s in range(wo):
                        dest[s] = src[s]


def _grad_transform(g, dm, cols, plane, rows):
    """dm[4k + l, o·cols + tile] = (A g_t Aᵀ)[k, l], g_t the tile's 2x2 of
    the output gradient (zero past Ho, Wo): the adjoint of ``_output_transform``."""
    batch, channels, ho, wo = g.shape
    tiles_h, tiles_w = plane.shape[0] // 2, plane.shape[1] // 2
    width = plane.shape[1]
    for r in range(plane.shape[0]):
        for s in range(width):
            plane[r, s] = 0
    for n in range(batch):
        for o in range(channels):
            for r in range(ho):
                src, dest = g[n, o, r], plane[r]
                for s in range(wo):
                    dest[s] = src[s]
            for a in range(tiles_h):
                g0, g1 = plane[2 * a], plane[2 * a + 1]
                r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
                for s in range(width):  # A g: rows (g0, g0 + g1, g0 - g1, -g1)
                    r0[s] = g0[s]
                    r1[s] = g0[s] + g1[s]
                    r2[s] = g0[s] - g1[s]
                    r3[s] = -g1[s]
                at = o * cols + (n * tiles_h + a) * tiles_w
                for k in range(4):  # (A g) Aᵀ: the columns the same way
                    row = rows[k]
                    out0, out1 = dm[4 * k, at:], dm[4 * k + 1, at:]
                    out2, out3 = dm[4 * k + 2, at:], dm[4 * k + 3, at:]
                    for b in range(tiles_w):
                        c0, c1 = row[2 * b], row[2 * b + 1]
                        out0[b] = c0
                        out1[b] = c0 + c1
                        out2[b] = c0 - c1
                        out3[b] = -c1


def _input_grad(dv, cols, gx, plane, rows, geom):
    """gx[n, c] = the sum over tiles of B dv_t Bᵀ added at the tile's patch
    of the padded plane, cut to the input: the adjoint of ``_input_transform``.
    A tile row's patches overlap the next one's in two rows: those wait in
    two carried rows, so each padded row is written once, straight to gx."""
    top, left = geom
    batch, channels, h, w = gx.shape
    tiles_h, tiles_w = (plane.shape[0] - 2) // 2, (plane.shape[1] - 2) // 2
    width = plane.shape[1]
    last = tiles_w - 1
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    carry0, carry1 = rows[4], rows[5]
    for n in range(batch):
        for c in range(channels):
            for s in range(width):
                carry0[s] = 0
                carry1[s] = 0
            for a in range(tiles_h + 1):
                if a < tiles_h:
                    at = c * cols + (n * tiles_h + a) * tiles_w
                    for k in range(4):
                        # (e B)ᵀ per tile, written without accumulation (so
                        # the loop vectorises): column 2b+2 takes tile b+1's
                        # first and tile b's third entry, 2b+3 tile b+1's
                        # second and tile b's fourth
                        e0, e1 = dv[4 * k, at:], dv[4 * k + 1, at:]
                        e2, e3 = dv[4 * k + 2, at:], dv[4 * k + 3, at:]
                        row = rows[k]
                        row[0] = e0[0]
                        row[1] = e1[0] - e2[0] + e3[0]
                        for b in range(last):
                            row[2 * b + 2] = e0[b + 1] - e0[b] + e1[b] + e2[b]
                            row[2 * b + 3] = e1[b + 1] - e2[b + 1] + e3[b + 1] - e3[b]
                        row[2 * tiles_w] = -e0[last] + e1[last] + e2[last]
                        row[2 * tiles_w + 1] = -e3[last]
                else:  # past the last tile row: the carried rows alone
                    for s in range(width):
                        r0[s] = 0
                        r1[s] = 0
                        r2[s] = 0
                        r3[s] = 0
                # B (…): padded rows 2a and 2a+1 complete; 2a+2, 2a+3 carried
                for i in range(2):
                    padded = 2 * a + i - top
                    if 0 <= padded < h:
                        dest = gx[n, c, padded]
                        lhs, src = (carry0, r0) if i == 0 else (carry1, r1)
                        if i == 0:
                            for s in range(w):
                                dest[s] = lhs[left + s] + src[left + s]
                        else:
                            for s in range(w):
                                q = left + s
                                dest[s] = lhs[q] + (r1[q] - r2[q] + r3[q])
                for s in range(width):
                    carry0[s] = r2[s] + r1[s] - r0[s]
                    carry1[s] = -r3[s]


_input_transform_kernel = CpuKernel(_input_transform)
_output_transform_kernel = CpuKernel(_output_transform)
_grad_transform_kernel = CpuKernel(_grad_transform)
_input_grad_kernel = CpuKernel(_input_grad)


def tiles(out_hw):
    """The tile grid (⌈Ho/2⌉, ⌈Wo/2⌉) of an output."""
    return (out_hw[0] + 1) // 2, (out_hw[1] + 1) // 2


def stacked(rows, cols, dtype):
    """An empty stack of 16 (rows, cols) matrices: (the C-contiguous (16,
    plane) buffer the kernels index as [k, row·cols + col], its (16, rows,
    cols) view for the GEMMs). The planes lie an odd number of cache lines
    apart: the transforms touch a tile in all 16 at once, and planes a
    multiple of 4 KiB apart fall in one L1 set and evict each other
    (measured 2-5x slower passes)."""
    itemsize = np.dtype(dtype).itemsize
    line = max(1, 64 // itemsize)
    plane = -(-rows * cols // line) * line
    if (plane // line) % 2 == 0:
        plane += line
    flat = np.empty((16, plane), dtype)
    view = np.lib.stride_tricks.as_strided(flat, (16, rows, cols),
                                           (plane * itemsize, cols * itemsize, itemsize))
    return flat, view


def transformed_weight(weight):
    """U (16, O, C) = G w Gᵀ for each (o, c), position k = 4·row + column:
    one GEMM, kron(G, G) (16, 9) against the weights as (9, O·C)."""
    o, c = weight.shape[:2]
    return np.matmul(GG.astype(weight.dtype), weight.reshape(o * c, 9).T).reshape(16, o, c)


class _Blocks:
    """Whole images, about ``BLOCK_TILES`` tiles a block, and the buffers a
    block's transforms and GEMMs share (kept in L2 from one to the next)."""

    def __init__(self, x_shape, out_channels, out_hw, dtype, pads):
        n, c = x_shape[:2]
        self.tiles_h, self.tiles_w = tiles(out_hw)
        per_block = max(1, BLOCK_TILES // (self.tiles_h * self.tiles_w))
        self.ranges = [(i, min(n, i + per_block)) for i in range(0, n, per_block)]
        self.span = per_block * self.tiles_h * self.tiles_w
        self.plane = np.empty((2 * self.tiles_h + 2, 2 * self.tiles_w + 2), dtype)
        self.rows = np.empty((8, self.plane.shape[1]), dtype)
        self.geom = (int(pads[0][0]), int(pads[1][0]))
        if pads[0][0] + x_shape[2] > self.plane.shape[0] or \
                pads[1][0] + x_shape[3] > self.plane.shape[1]:
            raise ValueError(f"winograd: input {tuple(x_shape)} with pads {pads} does not "
                             f"fit the tiles of output {tuple(out_hw)}")

    def tile_count(self, start, stop):
        return (stop - start) * self.tiles_h * self.tiles_w

    def transform_input(self, x, v, cols):
        _input_transform_kernel(x, v, cols, self.plane, self.rows, self.geom)


def forward(x, weight, bias, pads, out_hw):
    """(the convolution (N, O, Ho, Wo), x to save), a block of images at a
    time: V and M stay in the core's L2 between the transforms and the
    GEMMs (one pass over the input and the output in memory)."""
    check_target("winograd", x, weight, bias)
    x = np.ascontiguousarray(x)
    o = weight.shape[0]
    blocks = _Blocks(x.shape, o, out_hw, x.dtype, pads)
    u = transformed_weight(weight)
    out = np.empty((x.shape[0], o) + tuple(out_hw), x.dtype)
    bias = np.zeros(o, x.dtype) if bias is None else np.ascontiguousarray(bias)
    v_flat, v_all = stacked(x.shape[1], blocks.span, x.dtype)
    m_flat, m_all = stacked(o, blocks.span, x.dtype)
    sums = np.empty((8, blocks.tiles_w), x.dtype)
    for start, stop in blocks.ranges:
        t = blocks.tile_count(start, stop)
        blocks.transform_input(x[start:stop], v_flat, blocks.span)
        np.matmul(u, v_all[:, :, :t], out=m_all[:, :, :t])
        _output_transform_kernel(m_flat, blocks.span, bias, out[start:stop], sums,
                                 blocks.rows)
    return out, x


def backward(g, x, weight, pads, need_weight=True, need_input=True):
    """(dw or None, dx or None) from the output gradient g and the input x, a
    block of images at a time as in ``forward``: dM = A g Aᵀ, dU = Σ dM Vᵀ
    (each block's V computed again from x: cheaper than keeping 4x the
    input in memory), dw = Gᵀ dU G, dV = Uᵀ dM, dx = B dV Bᵀ added back."""
    check_target("winograd", g, x, weight)
    g, x = np.ascontiguousarray(g), np.ascontiguousarray(x)
    c, o = x.shape[1], weight.shape[0]
    blocks = _Blocks(x.shape, o, g.shape[2:], x.dtype, pads)
    ut = transformed_weight(weight).transpose(0, 2, 1)
    g_plane = np.empty((2 * blocks.tiles_h, 2 * blocks.tiles_w), x.dtype)
    dm_flat, dm_all = stacked(o, blocks.span, x.dtype)
    v_flat, v_all = stacked(c, blocks.span, x.dtype)  # V, then dV
    du = np.zeros((16, o, c), x.dtype)
    du_block = np.empty((16, o, c), x.dtype)
    gx = np.empty(x.shape, x.dtype) if need_input else None
    for start, stop in blocks.ranges:
        t = blocks.tile_count(start, stop)
        _grad_transform_kernel(g[start:stop], dm_flat, blocks.span, g_plane, blocks.rows)
        dm = dm_all[:, :, :t]
        if need_weight:
            blocks.transform_input(x[start:stop], v_flat, blocks.span)
            du += np.matmul(dm, v_all[:, :, :t].transpose(0, 2, 1), out=du_block)
        if need_input:
            np.matmul(ut, dm, out=v_all[:, :, :t])
            _input_grad_kernel(v_flat, blocks.span, gx[start:stop], blocks.plane, blocks.rows,
                               blocks.geom)
    gw = None
    if need_weight:
        gw = np.matmul(du.reshape(16, o * c).T, GG.astype(x.dtype)).reshape(o, c, 3, 3)
    return gw, gx


def warmup(dtype):
    """Compile the CPU kernels for ``dtype``."""
    x = np.ones((1, 1, 3, 3), dtype)
    w = np.ones((1, 1, 3, 3), dtype)
    pads = ((1, 1), (1, 1))
    out, saved = forward(x, w, None, pads, (3, 3))
    backward(out, saved, w, pads)
