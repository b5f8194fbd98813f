"""Winograd F(2x2, 3x3) for ``ops.conv``'s stride-1 3x3 convolutions (no
dilation, one group, at least ``dispatch.WINOGRAD_MIN_CHANNELS`` channels):
forward, input gradient and weight gradient, each a batch of 16 GEMMs with
2.25x fewer multiply-adds than the columns' GEMM, and no columns.

The output is cut into 2x2 tiles; tile t reads the 4x4 patch d of the
padded input under it (patches overlap by two rows and columns), and

    y_t = Aᵀ [ (G w Gᵀ) ⊙ (Bᵀ d_t B) ] A          (per output/input channel pair)

with Bᵀ (4x4), G (4x3) and Aᵀ (2x4) Lavin and Gray's (2015) constant
matrices, all three written out in the transforms' loops. Summed
over channels, each of the 16 positions (k) of the 4x4 transformed tile is a
GEMM: M[k] (O, T) = U[k] (O, C) @ V[k] (C, T), U = G w Gᵀ, V = Bᵀ d B for
the T tiles. The backward is the adjoint of each linear step: dM = A g_t Aᵀ
(``winograd_transforms.grad_transform``), dU[k] = dM[k] @ V[k]ᵀ, dw = Gᵀ dU
G; dV[k] = U[k]ᵀ @ dM[k], and each patch's B dV Bᵀ added back into the
padded input (``winograd_transforms.input_grad``): the gradients are exact
for what the forward computed.

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
columns' GEMM. An inf would turn into NaN here (inf - inf) where the direct
sum gives inf, and finite values near the top of the range could overflow
in the transforms' sums (then inf - inf): the input and gradient transforms
notice an inf, a NaN or such a value among those they read, ``forward`` and
``backward`` then return None, and ops.conv runs the columns' GEMM instead.
"""
import numpy as np

from ._target import check_target
from . import winograd_transforms as transforms

# The weight transform's G of F(2x2, 3x3) (Lavin and Gray, 2015):
# winograd_transforms.weight_transform writes G w Gᵀ out for every (o, c)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)

# A block of images holds about this many tiles times (input + output
# channels): V and M, 16·(C + O) values a tile, stay in the core's L2. Measured
# on ResNet-18's layers (forward + backward, blocks of 128 to 2048 tiles): 1024
# tiles best at 16 channels (5% over 256), 512 at 32, 256 at 64; 2048 tiles at
# 32 channels or more spilled and ran 1.8-2.9x slower; at least 256 tiles
# a block all the same (_Blocks: the full-width layers).
BLOCK_VALUES = 32768

# The forward's GEMMs read Uᵀ (C, O) copied contiguous from this many tiles
# in the batch (else the transposed view of U: BLAS's transposed-operand
# path), which costs a copy of U. The copy's price grows with U, its gain
# with the tiles times U: measured (b32, 1 thread, CPU time, forward, median
# of 5 runs of min of 9, loaded machine) with the copy / the view: 16
# channels at 32x32 (8192 tiles) 1.17 / 1.28 ms, 32 at 16x16 (2048) 0.73 /
# 0.86, 64 at 32x32 10.1 / 10.9, 128 at 16x16 7.4 / 7.7; 64 at 8x8 (512
# tiles) 0.59 / 0.63, 128 at 4x4 (128) 0.65 / 0.62, 256 at 8x8 (512) 8.3 /
# 7.5, 512 at 4x4 (128) 18.3 / 9.7 (a 16 MiB transposing copy). Backward
# reads U as the GEMMs' B untransposed already.
UT_COPY_MIN_TILES = 2048


def tiles(out_hw):
    """The tile grid (⌈Ho/2⌉, ⌈Wo/2⌉) of an output."""
    return (out_hw[0] + 1) // 2, (out_hw[1] + 1) // 2


def stacked(rows, cols, dtype):
    """A stack of 16 (rows, cols) matrices as (planes, mats): planes a
    C-contiguous (16, rows·cols + pad) buffer (what the transforms index)
    and mats its (16, rows, cols) view (views [:, :t] are the GEMMs'
    operands). The planes do not lie a multiple of 2 KiB apart: the
    transforms touch a tile in all 16 planes at once, and planes 4 KiB apart
    (16 channels of 8192 tiles: 512 KiB) fall in one L1 set and evict each
    other (measured 2-5x slower passes). The pad is one cache line at most,
    past each plane's end: adding rows instead cannot help when a row is
    itself a multiple of 2 KiB (512 channels in float32, 256 in float64)."""
    itemsize = np.dtype(dtype).itemsize
    size = rows * cols
    # (bytes // 64) % 64 in (0, 32): within a cache line of a multiple of 2 KiB;
    # one more cache line moves it off (to 1 or 33)
    pad = 64 // itemsize if (size * itemsize // 64) % 64 in (0, 32) else 0
    planes = np.empty((16, size + pad), dtype)
    return planes, planes[:, :size].reshape(16, rows, cols)


def transformed_weight(weight):
    """U (16, O, C) = G w Gᵀ for each (o, c), position k = 4·row + column
    (``winograd_transforms.weight_transform``), planes laid out by
    ``stacked``: written 16 planes at once, unpadded 512 x 512 planes (1 MiB
    apart) ran 4.7x slower (8.3 against 1.8 ms)."""
    o, c = weight.shape[:2]
    planes, u = stacked(o, c, weight.dtype)
    transforms.weight_transform(np.ascontiguousarray(weight).reshape(o, c * 9), planes)
    return u


class _Blocks:
    """Whole images, about ``BLOCK_VALUES / (C + O)`` tiles a block, and the buffers a
    block's transforms and GEMMs share (kept in L2 from one to the next)."""

    def __init__(self, x_shape, out_channels, out_hw, dtype, pads):
        n, c = x_shape[:2]
        self.tiles_h, self.tiles_w = tiles(out_hw)
        # at least BLOCK_VALUES / 128 (256) tiles: past 64 channels a side V and M
        # outgrow L2 anyway (64 KiB a tile at 512 + 512), and thin GEMMs and U read
        # again for every block cost more. ResNet-18's full-width 3x3 layers (b32,
        # forward + backward, 1 thread, CPU time, min of 5 on a loaded machine):
        # 512 channels at 4x4 38.9 (128 tiles) against 48.8 ms (64), 256 at 8x8
        # 22.9-23.2 (256) against 24.8-25.2 (128), 128 at 16x16 26.0-26.4 (256)
        # against 26.8-28.1 (128); 64 at 32x32 even at 256 and 512
        block_tiles = max(BLOCK_VALUES // (c + out_channels), BLOCK_VALUES // 128)
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
        self.probe = np.empty(self.rows.shape[1], dtype)  # the transforms' finiteness lanes

    def tile_count(self, start, stop):
        return (stop - start) * self.tiles_h * self.tiles_w

    def transform_input(self, x, v_planes):
        """V of a block of images; False when x holds an inf, a NaN or a
        value too large for the transform's sums."""
        return transforms.input_transform(x, self.xt, v_planes, self.in_rows, self.geom,
                                          self.probe)

    def transform_grad(self, g, dm_planes):
        """dM of a block of images; False when g holds an inf, a NaN or a
        value too large for the transform's sums."""
        return transforms.grad_transform(g, dm_planes, self.rows, self.probe)


def forward(x, weight, bias, pads, out_hw):
    """(the convolution (N, O, Ho, Wo), what backward needs: x and U), a
    block of images at a time: V and M stay in the core's L2 between the
    transforms and the GEMMs (one pass over the input and the output in
    memory). None when x holds an inf, a NaN or a value too large for the
    transform's sums (see the module docstring), found by the input
    transform itself."""
    check_target("winograd", x, weight, bias)
    x = np.ascontiguousarray(x)
    c, o = x.shape[1], weight.shape[0]
    blocks = _Blocks(x.shape, o, out_hw, x.dtype, pads)
    u = transformed_weight(weight)
    ut = u.transpose(0, 2, 1)
    if x.shape[0] * blocks.tiles_h * blocks.tiles_w >= UT_COPY_MIN_TILES:
        ut = np.ascontiguousarray(ut)
    out = np.empty((x.shape[0], o) + tuple(out_hw), x.dtype)
    bias = np.zeros(0, x.dtype) if bias is None else np.ascontiguousarray(bias)
    v_planes, v = stacked(blocks.span, c, x.dtype)
    m_planes, m = stacked(blocks.span, o, x.dtype)
    sums = np.empty((8, blocks.tiles_w * o), x.dtype)
    for start, stop in blocks.ranges:
        t = blocks.tile_count(start, stop)
        if not blocks.transform_input(x[start:stop], v_planes):
            return None
        np.matmul(v[:, :t], ut, out=m[:, :t])  # Mᵀ[k] (T, O) = Vᵀ[k] Uᵀ[k]
        transforms.output_transform(m_planes, bias, out[start:stop], sums,
                                    blocks.rows)
    return out, (x, u)


def backward(g, saved, weight, pads, need_weight=True, need_input=True):
    """(dw or None, dx or None) from the output gradient g and what
    ``forward`` saved (x and U: U is not computed again, 0.12 ms a call on
    average over ResNet-18's layers in a profile), a block of images at a time as in
    ``forward``: dM = A g Aᵀ, dU = Σ dM Vᵀ
    (each block's V computed again from x: cheaper than keeping 4x the
    input in memory), dw = Gᵀ dU G, dV = Uᵀ dM, dx = B dV Bᵀ added back.
    None when g holds an inf, a NaN or a value too large for the
    transform's sums, found by its transform."""
    x, u = saved
    check_target("winograd", g, x, weight)
    g = np.ascontiguousarray(g)
    c, o = x.shape[1], weight.shape[0]
    blocks = _Blocks(x.shape, o, g.shape[2:], x.dtype, pads)
    dm_planes, dm = stacked(blocks.span, o, x.dtype)
    v_planes, v = stacked(blocks.span, c, x.dtype)  # V, then dV
    if need_weight:  # each block's dU, folded into the gradient (O, C·9) as it comes
        (du_planes, du), gw = stacked(o, c, x.dtype), np.empty((o, c * 9), x.dtype)
    gx = np.empty(x.shape, x.dtype) if need_input else None
    plane = np.empty((blocks.padded[0], blocks.padded[1] * c), x.dtype)
    for start, stop in blocks.ranges:
        t = blocks.tile_count(start, stop)
        if not blocks.transform_grad(g[start:stop], dm_planes):
            return None
        if need_weight:
            blocks.transform_input(x[start:stop], v_planes)
            np.matmul(dm[:, :t].transpose(0, 2, 1), v[:, :t], out=du)
            transforms.weight_grad(du_planes, gw, start > 0)
        if need_input:
            np.matmul(dm[:, :t], u, out=v[:, :t])  # dVᵀ[k] (T, C) = dMᵀ[k] U[k]
            transforms.input_grad(v_planes, gx[start:stop], plane, blocks.in_rows,
                                  blocks.geom)
    return (gw.reshape(o, c, 3, 3) if need_weight else None), gx


def warmup(dtype):
    """Compile the CPU kernels for ``dtype``."""
    x = np.ones((1, 1, 3, 3), dtype)
    w = np.ones((1, 1, 3, 3), dtype)
    pads = ((1, 1), (1, 1))
    out, saved = forward(x, w, None, pads, (3, 3))
    backward(out, saved, w, pads)
