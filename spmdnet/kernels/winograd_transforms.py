"""The compiled passes of ``kernels.winograd`` (F(2x2, 3x3)): the input
transform, the output transform, the output gradient's transform and the
input gradient's, each over a block of whole images, channels-last inside
(see kernels/winograd.py for the layouts and why)."""
from ._cpu import CpuKernel
from ._numba import njit_inline

# The transposes between NCHW and the channels-last rows, an image row at a
# time (``_image_row_to``, ``_image_row_from``): from this width, one
# channel's run of the row against every C-th value of the padded row (in
# L1 while all channels pass); below it, a pixel at a time along the
# channels (runs of 2 or 4 values a channel cost more there). Measured (b32,
# 1 thread, CPU time, the input transform's whole pass): 64 channels at
# 32x32 2.1 against 3.5-4.2 ms for the pixel loop (then blocked 8 channels
# at a time: the planes, 4 KiB apart, share one L1 set), 128 at 16x16 0.8
# against 1.7; 256 at 8x8 0.65 against 0.49, 512 at 4x4 0.35 against 0.19.
ROWS_MIN_WIDTH = 16


def _input_transform(x, xt, v, rows, geom, probe):
    """v[4k + l, t·C + c] = (Bᵀ d B)[k, l] for every tile t's 4x4 patch d of
    x's zero-padded channels-last copy xt (nb, Hp, Wp·C), whose rows hold
    the even columns, then the odd ones (``_column``). Returns whether every
    value of x is finite and small enough for the transform's sums
    (``_all_zero``)."""
    top, left = geom
    batch, channels, h, w = x.shape
    tiles_h = (xt.shape[1] - 2) // 2
    length = xt.shape[2]
    half = length // 2
    tiles_w = half // channels - 1
    span = tiles_w * channels
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    zero, two = probe.dtype.type(0), probe.dtype.type(2)
    _clear(probe, length)
    for n in range(batch):
        for r in range(h):  # to channels-last (its border stays zero)
            _image_row_to(x[n], r, xt[n, top + r], left, half)
        for a in range(tiles_h):
            d0, d1 = xt[n, 2 * a], xt[n, 2 * a + 1]
            d2, d3 = xt[n, 2 * a + 2], xt[n, 2 * a + 3]
            for q in range(length):  # Bᵀ d: every patch's rows at once (and the probe)
                a0, a1 = d0[q] - d2[q], d1[q] + d2[q]
                a2, a3 = d2[q] - d1[q], d1[q] - d3[q]
                r0[q], r1[q], r2[q], r3[q] = a0, a1, a2, a3
                probe[q] += (abs(a0) + abs(a1) + abs(a2) + abs(a3)) * two * zero
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
    return _all_zero(probe, length)


@njit_inline
def _clear(probe, length):
    for q in range(length):
        probe[q] = 0


@njit_inline
def _all_zero(probe, length):
    """Whether the probe's lanes all stayed zero. The transforms' first loops
    add 2·(|r0| + |r1| + |r2| + |r3|)·0 of the rows they compute into one lane
    per column: NaN from an inf or a NaN, or from rows so large that the
    second stage's sums of two columns could overflow (then inf - inf), else
    zero. No fast-math here, so the products are not folded away. A lane per
    value, not one sum, and in the loop that computes the rows: it still
    vectorises (0.37-0.40 against 0.44 ms as a separate pass on the
    16-channel layer), and the op's own check of its inputs
    (``isfinite(x.sum())``, a pass through memory: about 2 ms a step of
    ResNet-18 at width 16) rides on the transform's reads."""
    total = probe.dtype.type(0)
    for q in range(length):
        total += probe[q]
    return total == 0


@njit_inline
def _column(col, half, channels):
    """Where padded column ``col`` starts in a channels-last row stored as
    its even columns, then its odd ones: every tile's columns are then a
    fixed offset from a run of tiles (one long loop, no interleaving)."""
    return (col % 2) * half + (col // 2) * channels


@njit_inline
def _to_rows(src, row, first, half, channels, c):
    """row[_column(first + s, half, channels) + c] = src[s] for every s: the
    even columns' values a channel stride apart, then the odd ones'."""
    width = src.shape[0]
    s0 = first % 2  # the first s on an even padded column
    even = row[((first + s0) // 2) * channels + c:]
    for j in range((width - s0 + 1) // 2):
        even[j * channels] = src[s0 + 2 * j]
    s1 = 1 - s0
    odd = row[half + ((first + s1) // 2) * channels + c:]
    for j in range((width - s1 + 1) // 2):
        odd[j * channels] = src[s1 + 2 * j]


@njit_inline
def _from_rows(row, dest, first, half, channels, c):
    """dest[s] = row[_column(first + s, half, channels) + c] for every s (the
    adjoint gather of ``_to_rows``)."""
    width = dest.shape[0]
    s0 = first % 2
    even = row[((first + s0) // 2) * channels + c:]
    for j in range((width - s0 + 1) // 2):
        dest[s0 + 2 * j] = even[j * channels]
    s1 = 1 - s0
    odd = row[half + ((first + s1) // 2) * channels + c:]
    for j in range((width - s1 + 1) // 2):
        dest[s1 + 2 * j] = odd[j * channels]


@njit_inline
def _image_row_to(image, r, row, first, half):
    """Row r of every channel of image (C, H, W) to the channels-last row:
    row[_column(first + s, half, C) + c] = image[c, r, s]."""
    channels, width = image.shape[0], image.shape[2]
    if width >= ROWS_MIN_WIDTH:
        for c in range(channels):
            _to_rows(image[c, r], row, first, half, channels, c)
    else:
        for s in range(width):
            dest = row[_column(first + s, half, channels):]
            for c in range(channels):
                dest[c] = image[c, r, s]


@njit_inline
def _image_row_from(row, image, r, first, half):
    """The adjoint of ``_image_row_to``: image[c, r, s] = row[_column(first +
    s, half, C) + c]."""
    channels, width = image.shape[0], image.shape[2]
    if width >= ROWS_MIN_WIDTH:
        for c in range(channels):
            _from_rows(row, image[c, r], first, half, channels, c)
    else:
        for s in range(width):
            src = row[_column(first + s, half, channels):]
            for c in range(channels):
                image[c, r, s] = src[c]


def _output_transform(m, bias, out, sums, rows):
    """out[n, o] = bias[o] + Aᵀ m_t A for every tile t, cut to (Ho, Wo); m is
    (16, T·O) channels-last; an empty bias adds nothing."""
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
            for i in range(min(2, ho - 2 * a)):  # back to NCHW, then the bias
                _image_row_from(rows[i], out[n], 2 * a + i, 0, span)
                if bias.shape[0] == 0:  # no bias
                    continue
                for o in range(channels):
                    dest, b0 = out[n, o, 2 * a + i], bias[o]
                    for s in range(wo):
                        dest[s] += b0


def _grad_transform(g, dm, rows, probe):
    """dm[4k + l, t·O + o] = (A g_t Aᵀ)[k, l], g_t the tile's 2x2 of the
    output gradient (zero past Ho, Wo): the adjoint of ``_output_transform``.
    Returns whether every value of g is finite and small enough for the
    transform's sums (``_all_zero``)."""
    batch, channels, ho, wo = g.shape
    tiles_h, tiles_w = (ho + 1) // 2, (wo + 1) // 2
    span = tiles_w * channels
    length = 2 * span
    g0, g1 = rows[4], rows[5]
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    for q in range(length):  # columns past Wo stay zero
        g0[q] = 0
        g1[q] = 0
    zero, two = probe.dtype.type(0), probe.dtype.type(2)
    _clear(probe, length)
    for n in range(batch):
        for a in range(tiles_h):
            if 2 * a + 1 == ho:  # past the last row: zero
                for q in range(length):
                    g1[q] = 0
            for i in range(min(2, ho - 2 * a)):  # rows 2a, 2a+1 to channels-last
                _image_row_to(g[n], 2 * a + i, rows[4 + i], 0, span)
            for q in range(length):  # A g: rows (g0, g0 + g1, g0 - g1, -g1), the probe
                a0, a1, a2, a3 = g0[q], g0[q] + g1[q], g0[q] - g1[q], -g1[q]
                r0[q], r1[q], r2[q], r3[q] = a0, a1, a2, a3
                probe[q] += (abs(a0) + abs(a1) + abs(a2) + abs(a3)) * two * zero
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
    return _all_zero(probe, length)


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
        for r in range(h):  # back to NCHW
            _image_row_from(plane[top + r], gx[n], r, left, half)


def _weight_transform(w, u):
    """u[4i + j, o·C + c] = (G w[o, c] Gᵀ)[i, j] for w (O, C·9) (the 3x3
    kernels flattened): G's rows (1, 0, 0), ½(1, 1, 1), ½(1, -1, 1), (0, 0,
    1) applied to the kernel's columns, then to the rows of that. The (16, 9)
    matrix kron(G, G) against the weights as one GEMM of inner size 9 took
    2.3 ms at 512 x 512 channels, this 1.8 (memory-bound there). Halving is
    exact, so only the sums' order rounds."""
    outs, ins = w.shape[0], w.shape[1] // 9
    half = w.dtype.type(0.5)
    for o in range(outs):
        p = w[o]
        u0, u1, u2, u3 = u[0, o * ins:], u[1, o * ins:], u[2, o * ins:], u[3, o * ins:]
        u4, u5, u6, u7 = u[4, o * ins:], u[5, o * ins:], u[6, o * ins:], u[7, o * ins:]
        u8, u9, u10, u11 = u[8, o * ins:], u[9, o * ins:], u[10, o * ins:], u[11, o * ins:]
        u12, u13, u14, u15 = u[12, o * ins:], u[13, o * ins:], u[14, o * ins:], u[15, o * ins:]
        for c in range(ins):
            k = 9 * c
            # G w: the kernel's rows r0, r1, r2 (three taps each) to four rows
            a0, a1, a2 = p[k], p[k + 1], p[k + 2]
            c0, c1, c2 = p[k + 6], p[k + 7], p[k + 8]
            b0 = half * (a0 + p[k + 3] + c0)
            b1 = half * (a1 + p[k + 4] + c1)
            b2 = half * (a2 + p[k + 5] + c2)
            d0 = half * (a0 - p[k + 3] + c0)
            d1 = half * (a1 - p[k + 4] + c1)
            d2 = half * (a2 - p[k + 5] + c2)
            # (G w) Gᵀ: each row's three values to four
            u0[c], u1[c], u2[c], u3[c] = a0, half * (a0 + a1 + a2), half * (a0 - a1 + a2), a2
            u4[c], u5[c], u6[c], u7[c] = b0, half * (b0 + b1 + b2), half * (b0 - b1 + b2), b2
            u8[c], u9[c], u10[c], u11[c] = d0, half * (d0 + d1 + d2), half * (d0 - d1 + d2), d2
            u12[c], u13[c], u14[c], u15[c] = c0, half * (c0 + c1 + c2), half * (c0 - c1 + c2), c2


def _weight_grad(du, gw, add):
    """gw[o, 9c + 3a + b] (+)= (Gᵀ du[:, o·C + c] G)[a, b], the adjoint of
    ``_weight_transform``: each block's dU (16, O·C) folded into the (O, C·9)
    gradient as it comes (no sum of the blocks' dU, no GEMM of inner size
    16 after them). ``add``: add to gw, else overwrite it."""
    outs, ins = gw.shape[0], gw.shape[1] // 9
    half = gw.dtype.type(0.5)
    for o in range(outs):
        q = gw[o]
        at = o * ins
        d0, d1, d2, d3 = du[0, at:], du[1, at:], du[2, at:], du[3, at:]
        d4, d5, d6, d7 = du[4, at:], du[5, at:], du[6, at:], du[7, at:]
        d8, d9, d10, d11 = du[8, at:], du[9, at:], du[10, at:], du[11, at:]
        d12, d13, d14, d15 = du[12, at:], du[13, at:], du[14, at:], du[15, at:]
        for c in range(ins):
            # each row i of du times G (four columns to three): s(i, 0..2)
            e0, f0 = half * (d1[c] + d2[c]), half * (d1[c] - d2[c])
            e1, f1 = half * (d5[c] + d6[c]), half * (d5[c] - d6[c])
            e2, f2 = half * (d9[c] + d10[c]), half * (d9[c] - d10[c])
            e3, f3 = half * (d13[c] + d14[c]), half * (d13[c] - d14[c])
            s00, s01, s02 = d0[c] + e0, f0, e0 + d3[c]
            s10, s11, s12 = d4[c] + e1, f1, e1 + d7[c]
            s20, s21, s22 = d8[c] + e2, f2, e2 + d11[c]
            s30, s31, s32 = d12[c] + e3, f3, e3 + d15[c]
            # Gᵀ (…): rows s0 + ½(s1 + s2), ½(s1 - s2), ½(s1 + s2) + s3
            m0, m1, m2 = half * (s10 + s20), half * (s11 + s21), half * (s12 + s22)
            n0, n1, n2 = half * (s10 - s20), half * (s11 - s21), half * (s12 - s22)
            k = 9 * c
            if add:
                q[k] += s00 + m0
                q[k + 1] += s01 + m1
                q[k + 2] += s02 + m2
                q[k + 3] += n0
                q[k + 4] += n1
                q[k + 5] += n2
                q[k + 6] += m0 + s30
                q[k + 7] += m1 + s31
                q[k + 8] += m2 + s32
            else:
                q[k] = s00 + m0
                q[k + 1] = s01 + m1
                q[k + 2] = s02 + m2
                q[k + 3] = n0
                q[k + 4] = n1
                q[k + 5] = n2
                q[k + 6] = m0 + s30
                q[k + 7] = m1 + s31
                q[k + 8] = m2 + s32


input_transform = CpuKernel(_input_transform)
output_transform = CpuKernel(_output_transform)
grad_transform = CpuKernel(_grad_transform)
input_grad = CpuKernel(_input_grad)
weight_transform = CpuKernel(_weight_transform)
weight_grad = CpuKernel(_weight_grad)
