"""The compiled passes of ``kernels.winograd`` (F(2x2, 3x3)): the input
transform, the output transform, the output gradient's transform and the
input gradient's, each over a block of whole images, channels-last inside
(see kernels/winograd.py for the layouts and why)."""
from ._cpu import CpuKernel
from ._numba import njit_inline

# From this many channels the transposes between NCHW and the channels-last
# rows run along the channels (strided reads or writes, one loop per pixel);
# below it along the image rows. Measured on the input's (blocks of ResNet-18's
# layers): 16.6 against 24.8 us at 16 channels, 36 against 16 at 32, 82
# against 21 at 128.
WIDE = 32

# Those transposes read or write one value per channel a plane apart; planes
# a multiple of 4 KiB apart (32x32 float32) fall in one L1 set (64 sets of 64
# bytes here, 12 ways), so past about 16 lines a set (channels x the plane's
# bytes, up to 4 KiB, over 64 KiB) the transposes run CHANNEL_BLOCK channels
# at a time. Measured forward + backward, b32, 1 thread, CPU time: 64
# channels at 32x32 45 against 70 ms (the transforms 24 against 53), 128 at
# 16x16 30.0 against 32.3; at 32 channels 16x16 and 256 at 8x8 blocks were
# 10-30% slower.
CHANNEL_BLOCK = 8
ALIASED_BYTES = 65536


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
        # to channels-last (its border stays zero)
        if channels >= WIDE:
            flat = x[n].reshape(channels * h * w)
            if _aliased(channels, h * w * x.itemsize):
                for c0 in range(0, channels, CHANNEL_BLOCK):
                    c1 = min(channels, c0 + CHANNEL_BLOCK)
                    for r in range(h):
                        for s in range(w):
                            dest = xt[n, top + r, _column(left + s, half, channels):]
                            src = flat[r * w + s:]
                            for c in range(c0, c1):
                                dest[c] = src[c * h * w]
            else:
                for r in range(h):
                    for s in range(w):
                        dest = xt[n, top + r, _column(left + s, half, channels):]
                        src = flat[r * w + s:]
                        for c in range(channels):
                            dest[c] = src[c * h * w]
        else:
            for c in range(channels):
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
def _aliased(channels, plane_bytes):
    """True when a transpose runs CHANNEL_BLOCK channels a pass (ALIASED_BYTES)."""
    return channels * min(plane_bytes, 4096) > ALIASED_BYTES


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
            # back to NCHW, with the bias
            if channels >= WIDE:
                flat = out[n].reshape(channels * ho * wo)
                if _aliased(channels, ho * wo * out.itemsize):
                    for o0 in range(0, channels, CHANNEL_BLOCK):
                        o1 = min(channels, o0 + CHANNEL_BLOCK)
                        for i in range(min(2, ho - 2 * a)):
                            for s in range(wo):
                                src = rows[i, _column(s, span, channels):]
                                dest = flat[(2 * a + i) * wo + s:]
                                for o in range(o0, o1):
                                    dest[o * ho * wo] = src[o] + bias[o]
                else:
                    for i in range(min(2, ho - 2 * a)):
                        for s in range(wo):
                            src = rows[i, _column(s, span, channels):]
                            dest = flat[(2 * a + i) * wo + s:]
                            for o in range(channels):
                                dest[o * ho * wo] = src[o] + bias[o]
            else:
                for o in range(channels):
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
            # rows 2a, 2a+1 to channels-last, even/odd
            if channels >= WIDE:
                flat = g[n].reshape(channels * ho * wo)
                if _aliased(channels, ho * wo * g.itemsize):
                    for o0 in range(0, channels, CHANNEL_BLOCK):
                        o1 = min(channels, o0 + CHANNEL_BLOCK)
                        for i in range(min(2, ho - 2 * a)):
                            for s in range(wo):
                                dest = rows[4 + i, _column(s, span, channels):]
                                src = flat[(2 * a + i) * wo + s:]
                                for o in range(o0, o1):
                                    dest[o] = src[o * ho * wo]
                else:
                    for i in range(min(2, ho - 2 * a)):
                        for s in range(wo):
                            dest = rows[4 + i, _column(s, span, channels):]
                            src = flat[(2 * a + i) * wo + s:]
                            for o in range(channels):
                                dest[o] = src[o * ho * wo]
            else:
                for o in range(channels):
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
        if channels >= WIDE:  # back to NCHW
            flat = gx[n].reshape(channels * h * w)
            if _aliased(channels, h * w * gx.itemsize):
                for c0 in range(0, channels, CHANNEL_BLOCK):
                    c1 = min(channels, c0 + CHANNEL_BLOCK)
                    for r in range(h):
                        for s in range(w):
                            src = plane[top + r, _column(left + s, half, channels):]
                            dest = flat[r * w + s:]
                            for c in range(c0, c1):
                                dest[c * h * w] = src[c]
            else:
                for r in range(h):
                    for s in range(w):
                        src = plane[top + r, _column(left + s, half, channels):]
                        dest = flat[r * w + s:]
                        for c in range(channels):
                            dest[c * h * w] = src[c]
        else:
            for c in range(channels):
                for r in range(h):
                    src, dest = plane[top + r], gx[n, c, r]
                    for s in range(w):
                        dest[s] = src[_column(left + s, half, channels) + c]


input_transform = CpuKernel(_input_transform)
output_transform = CpuKernel(_output_transform)
grad_transform = CpuKernel(_grad_transform)
input_grad = CpuKernel(_input_grad)
