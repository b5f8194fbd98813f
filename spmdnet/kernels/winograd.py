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
(``BLOCK_VALUES``), whose V, M and GEMM operands stay in L2, and the input is
saved instead of V (its transform is computed again in backward: less
memory and faster than reading V back).

Channels-last inside: each block of the input is copied to a zero-padded
(H, W, C) layout, V and M are kept transposed (16, T, C) and (16, T, O)
(the GEMMs Vᵀ Uᵀ), so every transform loop runs along the channels or a
whole padded row of them, contiguous. The first version ran along NCHW
rows (a tile row of 2-16 tiles per loop) and was 1.3-1.5x slower forward
and backward on ResNet-18's layers (per-plane loop overhead at 4x4 and 8x8).
The kernels index 1-D rows of C-contiguous buffers (no index wraparound
test) and write one destination per loop where they add (few pointers for
LLVM's overlap checks): that is what lets LLVM vectorise them.

Rounding: the transforms add and subtract inputs (and quarter weights)
before the products, so float32 results differ from the direct sum by
rounding of the inputs' magnitude (tests: within 2e-6 of the largest value
on a 16-channel layer); ``SPMDNET_KERNELS=xp`` and CuPy arrays keep the
columns' GEMM.
"""
import numpy as np

from ._cpu import CpuKernel
from ._numba import njit_inline
from ._target import check_target

# The transform matrices of F(2x2, 3x3) (Lavin and Gray, 2015)
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
# G w Gᵀ for all (o, c) at once: (G ⊗ G) (16, 9) times w flattened (9,); exact
# in float32 (entries 0, ±1/4, ±1/2, 1)
GG = np.kron(G, G)

# A block of images holds about this many tiles times (input + output
# channels): V and M, 16·(C + O) values a tile, stay in the core's L2. Measured
# on ResNet-18's layers (forward + backward, blocks of 128 to 2048 tiles): 1024
# tiles best at 16 channels (5% over 256), 512 at 32, 256 at 64; 2048 tiles at
# 32 channels or more spilled and ran 1.8-2.9x slower.
BLOCK_VALUES = 32768


def _input_transform(x, xt, v, rows, geom):
    """v[4k + l, t·C + c] = (Bᵀ d B)[k, l] for every tile t's 4x4 patch d of
    x's zero-padded channels-last copy xt (nb, Hp, Wp·C), whose rows hold
    the even columns, then the odd ones (``_column``)."""
    top, left = geom
    batch, channels, h, w = x.shape
    tiles_h = (xt.shape[1] - 2) // 2
    length = xt.shape[2]
    half = length // 2
    tiles_w = half // channels - 1
    span = tiles_w * channels
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    for n in range(batch):
        for c in range(channels):  # to channels-last (its border stays zero)
            for r in range(h):
                src, dest = x[n, c, r], xt[n, top + r]
                for s in range(w):
                    dest[_column(left + s, half, channels) + c] = src[s]
        for a in range(tiles_h):
            d0, d1 = xt[n, 2 * a], xt[n, 2 * a + 1]
            d2, d3 = xt[n, 2 * a + 2], xt[n, 2 * a + 3]
            for q in range(length):  # Bᵀ d: every patch's rows at once
                r0[q] = d0[q] - d2[q]
                r1[q] = d1[q] + d2[q]
                r2[q] = d2[q] - d1[q]
                r3[q] = d1[q] - d3[q]
            at = (n * tiles_h + a) * span
            for k in range(4):  # (Bᵀ d) B: tile b's columns 2b..2b+3 are
                row = rows[k]  # even b, odd b, even b+1, odd b+1
                e0, e1, e2, e3 = row, row[half:], row[channels:], row[half + channels:]
                out0, out1 = v[4 * k, at:], v[4 * k + 1, at:]
                out2, out3 = v[4 * k + 2, at:], v[4 * k + 3, at:]
                for q in range(span):
                    out0[q] = e0[q] - e2[q]
                    out1[q] = e1[q] + e2[q]
                    out2[q] = e2[q] - e1[q]
                    out3[q] = e1[q] - e3[q]


@njit_inline
def _column(col, half, channels):
    """Where padded column ``col`` starts in a channels-last row stored as
    its even columns, then its odd ones: every tile's columns are then a
    fixed offset from a run of tiles (one long loop, no interleaving)."""
    return (col % 2) * half + (col // 2) * channels


def _output_transform(m, bias, out, sums, rows):
    """out[n, o] = bias[o] + Aᵀ m_t A for every tile t, cut to (Ho, Wo); m is
    (16, T·O) channels-last."""
    batch, channels, ho, wo = out.shape
    tiles_h, tiles_w = (ho + 1) // 2, (wo + 1) // 2
    span = tiles_w * channels
    for n in range(batch):
        for a in range(tiles_h):
            at = (n * tiles_h + a) * span
            for col in range(4):  # Aᵀ m: rows 0 and 1, this column, the tile row at once
                m0, m1 = m[col, at:], m[4 + col, at:]
                m2, m3 = m[8 + col, at:], m[12 + col, at:]
                upper, lower = sums[col], sums[4 + col]
                for q in range(span):
                    upper[q] = m0[q] + m1[q] + m2[q]
                    lower[q] = m1[q] - m2[q] - m3[q]
            for i in range(2):  # (Aᵀ m) A: output row 2a + i, even columns then odd
                s0, s1, s2, s3 = sums[4 * i], sums[4 * i + 1], sums[4 * i + 2], sums[4 * i + 3]
                even, odd = rows[i], rows[i, span:]
                for q in range(span):
                    even[q] = s0[q] + s1[q] + s2[q]
                    odd[q] = s1[q] - s2[q] - s3[q]
            for o in range(channels):  # back to NCHW, with the bias
                b0 = bias[o]
                for i in range(min(2, ho - 2 * a)):
                    src, dest = rows[i], out[n, o, 2 * a + i]
                    for s in range(wo):
                        dest[s] = src[_column(s, span, channels) + o] + b0


def _grad_transform(g, dm, rows):
    """dm[4k + l, t·O + o] = (A g_t Aᵀ)[k, l], g_t the tile's 2x2 of the
    output gradient (zero past Ho, Wo): the adjoint of ``_output_transform``."""
    batch, channels, ho, wo = g.shape
    tiles_h, tiles_w = (ho + 1) // 2, (wo + 1) // 2
    span = tiles_w * channels
    length = 2 * span
    g0, g1 = rows[4], rows[5]
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    for q in range(length):  # columns past Wo stay zero
        g0[q] = 0
        g1[q] = 0
    for n in range(batch):
        for a in range(tiles_h):
            if 2 * a + 1 == ho:  # past the last row: zero
                for q in range(length):
                    g1[q] = 0
            for o in range(channels):  # rows 2a, 2a+1 to channels-last, even/odd
                for i in range(min(2, ho - 2 * a)):
                    src, dest = g[n, o, 2 * a + i], rows[4 + i]
                    for s in range(wo):
                        dest[_column(s, span, channels) + o] = src[s]
            for q in range(length):  # A g: rows (g0, g0 + g1, g0 - g1, -g1)
                r0[q] = g0[q]
                r1[q] = g0[q] + g1[q]
                r2[q] = g0[q] - g1[q]
                r3[q] = -g1[q]
            at = (n * tiles_h + a) * span
            for k in range(4):  # (A g) Aᵀ: the even and odd column of each tile
                even, odd = rows[k], rows[k, span:]
                out0, out1 = dm[4 * k, at:], dm[4 * k + 1, at:]
                out2, out3 = dm[4 * k + 2, at:], dm[4 * k + 3, at:]
                for q in range(span):
                    out0[q] = even[q]
                    out1[q] = even[q] + odd[q]
                    out2[q] = even[q] - odd[q]
                    out3[q] = -odd[q]


def _input_grad(dv, gx, plane, rows, geom):
    """gx[n, c] = the sum over tiles of B dv_t Bᵀ added at the tile's patch of
    the padded channels-last plane (Hp, Wp·C, even columns then odd), cut to
    the input: the adjoint of ``_input_transform``."""
    top, left = geom
    batch, channels, h, w = gx.shape
    tiles_h = (plane.shape[0] - 2) // 2
    length = plane.shape[1]
    half = length // 2
    span = (half // channels - 1) * channels
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    for n in range(batch):
        for r in range(plane.shape[0]):
            for q in range(length):
                plane[r, q] = 0
        for a in range(tiles_h):
            at = (n * tiles_h + a) * span
            for k in range(4):  # (e B)ᵀ: tile b adds to columns 2b..2b+3
                row = rows[k]
                e0, e1 = dv[4 * k, at:], dv[4 * k + 1, at:]
                e2, e3 = dv[4 * k + 2, at:], dv[4 * k + 3, at:]
                even, odd = row, row[half:]
                for q in range(span):  # columns 2b, 2b+1
                    even[q] = e0[q]
                    odd[q] = e1[q] - e2[q] + e3[q]
                for q in range(span, span + channels):
                    even[q] = 0
                    odd[q] = 0
                # columns 2b+2, 2b+3: one destination per loop (few pointers
                # for LLVM's overlap checks, so each loop vectorises)
                later = row[channels:]
                for q in range(span):
                    later[q] += e2[q] + e1[q] - e0[q]
                later = row[half + channels:]
                for q in range(span):
                    later[q] -= e3[q]
            p0, p1 = plane[2 * a], plane[2 * a + 1]
            p2, p3 = plane[2 * a + 2], plane[2 * a + 3]
            for q in range(length):  # B (…): the rows, added (patches overlap)
                p0[q] += r0[q]
            for q in range(length):
                p1[q] += r1[q] - r2[q] + r3[q]
            for q in range(length):
                p2[q] += r2[q] + r1[q] - r0[q]
            for q in range(length):
                p3[q] -= r3[q]
        for c in range(channels):  # back to NCHW
            for r in range(h):
                src, dest = plane[top + r], gx[n, c, r]
                for s in range(w):
                    dest[s] = src[_column(left + s, half, channels) + c]


_input_transform_kernel = CpuKernel(_input_transform)
_output_transform_kernel = CpuKernel(_output_transform)
_grad_transform_kernel = CpuKernel(_grad_transform)
_input_grad_kernel = CpuKernel(_input_grad)


def tiles(out_hw):
    """The tile grid (⌈Ho/2⌉, ⌈Wo/2⌉) of an output."""
    return (out_hw[0] + 1) // 2, (out_hw[1] + 1) // 2


def stacked(rows, cols, dtype):
    """An empty C-contiguous stack of 16 (rows', cols) matrices, rows' >= rows,
    whose planes do not lie a multiple of 2 KiB apart: the transforms touch
    a tile in all 16 planes at once, and planes 4 KiB apart (16 channels of
    8192 tiles: 512 KiB) fall in one L1 set and evict each other (measured
    2-5x slower passes). Views [:, :t] are the GEMMs' operands."""
    itemsize = np.dtype(dtype).itemsize
    while (rows * cols * itemsize // 64) % 64 in (0, 32):
        rows += 1
    return np.empty((16, rows, cols), dtype)


def transformed_weight(weight):
    """U (16, O, C) = G w Gᵀ for each (o, c), position k = 4·row + column:
    one GEMM, kron(G, G) (16, 9) against the weights as (9, O·C)."""
    o, c = weight.shape[:2]
    return np.matmul(GG.astype(weight.dtype), weight.reshape(o * c, 9).T).reshape(16, o, c)


class _Blocks:
    """Whole images, about ``BLOCK_VALUES / (C + O)`` tiles a block, and the buffers a
    block's transforms and GEMMs share (kept in L2 from one to the next)."""

    def __init__(self, x_shape, out_channels, out_hw, dtype, pads):
        n, c = x_shape[:2]
        self.tiles_h, self.tiles_w = tiles(out_hw)
        block_tiles = BLOCK_VALUES // (c + out_channels)
        per_block = max(1, block_tiles // (self.tiles_h * self.tiles_w))
        self.ranges = [(i, min(n, i + per_block)) for i in range(0, n, per_block)]
        self.span = per_block * self.tiles_h * self.tiles_w
        self.padded = (2 * self.tiles_h + 2, 2 * self.tiles_w + 2)
        self.geom = (int(pads[0][0]), int(pads[1][0]))
        if pads[0][0] + x_shape[2] > self.padded[0] or \
                pads[1][0] + x_shape[3] > self.padded[1]:
            raise ValueError(f"winograd: input {tuple(x_shape)} with pads {pads} does not "
                             f"fit the tiles of output {tuple(out_hw)}")
        # the input block channels-last and zero-padded (its border stays zero)
        self.xt = np.zeros((per_block, self.padded[0], self.padded[1] * c), dtype)
        self.rows = np.empty((6, self.padded[1] * max(c, out_channels)), dtype)
        self.in_rows = self.rows[:4, :self.padded[1] * c]

    def tile_count(self, start, stop):
        return (stop - start) * self.tiles_h * self.tiles_w

    def transform_input(self, x, v):
        _input_transform_kernel(x, self.xt, v.reshape(16, -1), self.in_rows, self.geom)


def forward(x, weight, bias, pads, out_hw):
    """(the convolution (N, O, Ho, Wo), what backward needs: x and U), a
    block of images at a time: V and M stay in the core's L2 between the
    transforms and the GEMMs (one pass over the input and the output in
    memory)."""
    check_target("winograd", x, weight, bias)
    x = np.ascontiguousarray(x)
    c, o = x.shape[1], weight.shape[0]
    blocks = _Blocks(x.shape, o, out_hw, x.dtype, pads)
    u = transformed_weight(weight)
    ut = u.transpose(0, 2, 1)
    out = np.empty((x.shape[0], o) + tuple(out_hw), x.dtype)
    bias = np.zeros(o, x.dtype) if bias is None else np.ascontiguousarray(bias)
    v, m = stacked(blocks.span, c, x.dtype), stacked(blocks.span, o, x.dtype)
    sums = np.empty((8, blocks.tiles_w * o), x.dtype)
    for start, stop in blocks.ranges:
        t = blocks.tile_count(start, stop)
        blocks.transform_input(x[start:stop], v)
        np.matmul(v[:, :t], ut, out=m[:, :t])  # Mᵀ[k] (T, O) = Vᵀ[k] Uᵀ[k]
        _output_transform_kernel(m.reshape(16, -1), bias, out[start:stop], sums,
                                 blocks.rows)
    return out, (x, u)


def backward(g, saved, weight, pads, need_weight=True, need_input=True):
    """(dw or None, dx or None) from the output gradient g and what
    ``forward`` saved (x and U: U is not computed again, 0.1 ms a call on
    ResNet's 128-channel layers), a block of images at a time as in
    ``forward``: dM = A g Aᵀ, dU = Σ dM Vᵀ
    (each block's V computed again from x: cheaper than keeping 4x the
    input in memory), dw = Gᵀ dU G, dV = Uᵀ dM, dx = B dV Bᵀ added back."""
    x, u = saved
    check_target("winograd", g, x, weight)
    g = np.ascontiguousarray(g)
    c, o = x.shape[1], weight.shape[0]
    blocks = _Blocks(x.shape, o, g.shape[2:], x.dtype, pads)
    dm, v = stacked(blocks.span, o, x.dtype), stacked(blocks.span, c, x.dtype)  # V, then dV
    du = np.zeros((16, o, c), x.dtype)
    du_block = np.empty((16, o, c), x.dtype)
    gx = np.empty(x.shape, x.dtype) if need_input else None
    plane = np.empty((blocks.padded[0], blocks.padded[1] * c), x.dtype)
    for start, stop in blocks.ranges:
        t = blocks.tile_count(start, stop)
        _grad_transform_kernel(g[start:stop], dm.reshape(16, -1), blocks.rows)
        if need_weight:
            blocks.transform_input(x[start:stop], v)
            du += np.matmul(dm[:, :t].transpose(0, 2, 1), v[:, :t], out=du_block)
        if need_input:
            np.matmul(dm[:, :t], u, out=v[:, :t])  # dVᵀ[k] (T, C) = dMᵀ[k] U[k]
            _input_grad_kernel(v.reshape(16, -1), gx[start:stop], plane, blocks.in_rows,
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
