"""The LSTM recurrence's float32 steps: per step one product and one kernel.

``ops.rnn.LSTMSequence`` takes these for float32 NumPy arrays (dispatch.py,
``takes``); other arrays run its xp code. Per time step:

- ``forward``: the product h W_hhᵀ (N, 4H) (PyTorch's layout: i, f, g, o
  blocks of H; W_hhᵀ copied contiguous once: BLAS's transposed-operand path
  is slower at these sizes; in column blocks, ``_column_blocks``), then one
  kernel: the product and the bias added to the step's input projection,
  which becomes the activated gates in place (over xw itself when the
  caller allows), sigmoid(a) = tanh(a / 2) / 2 + 1/2 as in the xp code,
  c = f c_prev + i g, tanh(c) and h = o tanh(c) written straight into the
  op's output. tanh is ``_tanh`` below, a rational approximation in float32
  arithmetic that LLVM vectorises (in the forward kernel, built with FMA
  contraction: within 4.8 ulp of float64 tanh on a dense grid of [-12, 12],
  0.63 ulp on average; NumPy's tanh is within 1.4): a call of Numba's libm
  tanh per element, or NumPy's tanh between kernels, cost more than the
  kernel.
- ``backward``: one pass over (N, H) that adds the incoming gradient at h
  and writes the gradients of the four gates' pre-activations and the cell
  gradient carried to the step before, then the product d_gates W_hh (the
  gradient at the previous h).

So the kernels give the xp code's numbers up to the tanh's rounding
(tests/test_rnn_kernels.py); speed: benchmarks/lstm_step.py.
"""
import numpy as np

from ._cpu import CpuKernel
from ._numba import njit_inline, prange
from ._target import check_target

_f = np.float32
# tanh(x) = x P(x²) / Q(x²) on [-9, 9], x clamped there: float32 tanh is
# 0.99999994 from 9 to about 9.01 and 1 beyond: the clamp costs at most an ulp there;
# a least-squares fit of the relative error, refined towards minimax (Lawson's
# weights), 6.7e-9 in exact arithmetic; float32 evaluation adds the rest
_P0, _P1, _P2 = _f(0.9999999934313203), _f(0.13084041763938972), _f(0.003103991441955542)
_P3, _P4 = _f(1.115467321699455e-05), _f(-2.0226687202711037e-08)
_P5, _P6 = _f(5.278642846176899e-11), _f(-8.490472940671863e-14)
_Q1, _Q2, _Q3 = _f(0.46417368880622495), _f(0.02449531906127508), _f(0.0002546196306088704)
_NINE, _ONE = _f(9), _f(1)


@njit_inline
def _tanh(x):
    """tanh of a float32 in float32 arithmetic; NaN stays NaN (the
    comparisons are false for it), ±inf gives ±1."""
    x = _NINE if x > _NINE else x
    x = -_NINE if x < -_NINE else x
    z = x * x
    p = (((((_P6 * z + _P5) * z + _P4) * z + _P3) * z + _P2) * z + _P1) * z + _P0
    y = x * p / (((_Q3 * z + _Q2) * z + _Q1) * z + _ONE)
    y = _ONE if y > _ONE else y
    return -_ONE if y < -_ONE else y


def _forward_step(t, before, pre, consts, c0, gates, cs, tanh_cs, out):
    """Step t: gates[t] (N, 4H) holds the input projection x_t W_ihᵀ, pre
    (N, 4H) h W_hhᵀ; adds pre and the bias consts[0] into gates[t] and
    activates it in place (y = tanh(a s) s + add with s, add = consts[1],
    consts[2]: sigmoid for s = add = 1/2, tanh for s = 1, add = 0), then c,
    tanh(c) into cs[t], tanh_cs[t] and h into out[t], from the c of step
    ``before`` (c0 when outside the T steps). Two loops: one over the 4H gate
    values, one over H (a single loop that stores into four blocks of one
    row is not vectorised)."""
    n, size = c0.shape
    c_prev = cs[before] if 0 <= before < cs.shape[0] else c0
    gate, c, tanh_c, h = gates[t], cs[t], tanh_cs[t], out[t]
    bias, scale, add = consts[0], consts[1], consts[2]
    for r in prange(n):
        p, pr = gate[r], pre[r]
        for j in range(4 * size):
            p[j] = _tanh((p[j] + pr[j] + bias[j]) * scale[j]) * scale[j] + add[j]
        cp, cr, tr, hr = c_prev[r], c[r], tanh_c[r], h[r]
        for k in range(size):
            cc = p[size + k] * cp[k] + p[k] * p[2 * size + k]
            cr[k] = cc
            th = _tanh(cc)
            tr[k] = th
            hr[k] = p[3 * size + k] * th


def _backward_step(t, before, grad, dh, dc, gates, cs, c0, tanh_cs, d_gates):
    """Step t of backpropagation through time: dh (N, H) + grad[t] is the
    gradient at the step's h, dc (N, H) at its c; writes the gradients of the
    gates' pre-activations into d_gates[t] (N, 4H) and into dc (in place) the
    gradient at the c the step read: cs[before], or c0 when ``before`` is
    outside the T steps. The four gate blocks are stored through four row
    slices: LLVM vectorises that, not stores at four offsets of one row."""
    one = gates.dtype.type(1)
    n, size = dc.shape
    c_prev = cs[before] if 0 <= before < cs.shape[0] else c0
    gate, d_gate, tanh_c, g_t = gates[t], d_gates[t], tanh_cs[t], grad[t]
    for r in prange(n):
        gr, th_r, gt_r, cp, dh_r, dc_r = gate[r], tanh_c[r], g_t[r], c_prev[r], dh[r], dc[r]
        dr = d_gate[r]
        di, df, dg, do = dr[:size], dr[size:2 * size], dr[2 * size:3 * size], dr[3 * size:]
        for k in range(size):
            i, f = gr[k], gr[size + k]
            g, o = gr[2 * size + k], gr[3 * size + k]
            th = th_r[k]
            d_h = dh_r[k] + gt_r[k]
            d_c = dc_r[k] + d_h * (o * (one - th * th))
            di[k] = d_c * (g * i * (one - i))
            df[k] = d_c * (cp[k] * f * (one - f))
            dg[k] = d_c * (i * (one - g * g))
            do[k] = d_h * (th * o * (one - o))
            dc_r[k] = d_c * f


# "contract": LLVM fuses a * b + c into one FMA (one rounding instead of two):
# the forward kernel 5.5 against 7.4 us per step (N 20, H 200); backward gains nothing
_forward_kernel = CpuKernel(_forward_step, fastmath={"contract"})
_backward_kernel = CpuKernel(_backward_step)


def takes(*arrays):
    """The kernels' arrays (xw, h0, c0, w_hh[, bias]): float32 (``_tanh`` is a
    float32 approximation; float64 runs the op's xp code, NumPy's tanh)."""
    return all(a.dtype == np.float32 for a in arrays)


def _check_shapes(what, length, n, size, **arrays):
    """Each named array's shape against its expected one: ValueError naming it."""
    for name, (got, want) in arrays.items():
        if tuple(got) != want:
            raise ValueError(f"LSTM {what} kernels: {name} has shape {tuple(got)}, "
                             f"expected {want} for T={length}, N={n}, H={size}")


def _check_float32(what, **arrays):
    for name, a in arrays.items():
        if a.dtype != np.float32:
            raise TypeError(f"LSTM {what} kernels: {name} is {a.dtype}, they take float32 "
                            "(float64 runs ops/rnn.py's xp code)")


def _steps(length, reverse):
    return range(length - 1, -1, -1) if reverse else range(length)


# OpenBLAS (0.3.31, its SkylakeX kernels: this machine's AVX-512) multiplies
# products of m·k·n <= 100³ with its small-matrix kernels, which skip packing
# the operands: the per-step products of nn.LSTM(200, 200) at batch 20, split
# into 4 or 5 column blocks, measured 38-41 against 43-46 us forward ((20, 200)
# x (200, 800)) and 43-45 against 54-56 us backward ((20, 800) x (800, 200)).
# Larger products stay whole (more than 8 blocks measured slower).
_SMALL_PRODUCT, _MAX_BLOCKS = 100 ** 3, 8


def _column_blocks(m, k, n):
    """Column ranges of an (m, k) x (k, n) product, each block at most
    _SMALL_PRODUCT multiply-adds; one range when that takes over _MAX_BLOCKS."""
    count = -(-m * k * n // _SMALL_PRODUCT)
    if count <= 1 or count > _MAX_BLOCKS:
        return [(0, n)]
    edges = [n * i // count for i in range(count + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _product(a, b, out, blocks):
    """out = a @ b, one product per column block (``_column_blocks``)."""
    if len(blocks) == 1:
        np.dot(a, b, out=out)  # ~1 us less per call than np.matmul
        return
    for lo, hi in blocks:
        np.matmul(a, b[:, lo:hi], out=out[:, lo:hi])


def _constants(bias, size):
    """(3, 4H): the bias (zeros when None), then per gate value the scale and
    the addend of y = tanh(a s) s + add: sigmoid rows i, f, o take tanh(a / 2)
    / 2 + 1/2, g's rows tanh(a)."""
    consts = np.full((3, 4 * size), 0.5, np.float32)
    consts[0] = 0 if bias is None else bias
    consts[1:, 2 * size:3 * size] = [[1], [0]]
    return consts


def forward(xw, h0, c0, w_hh, reverse, bias=None, overwrite_xw=False):
    """LSTMSequence's forward over all T steps: (gates (T, N, 4H) activated,
    cs, tanh(cs) (each (T, N, H)), out (T + 1, N, H): each step's h, then the
    last c) from the input projection xw (T, N, 4H), h0, c0 (N, H), w_hh
    (4H, H) and the bias b_ih + b_hh (4H,) or None, all float32; ``reverse``:
    the steps run from T-1 down to 0 (outputs stay in time order).
    ``overwrite_xw``: the gates are written over xw (a C-contiguous array no
    one else reads), not into a copy: one (T, N, 4H) array less to fill."""
    arrays = dict(xw=xw, h0=h0, c0=c0, w_hh=w_hh) | ({} if bias is None else dict(bias=bias))
    check_target("LSTM forward", *arrays.values())
    _check_float32("forward", **arrays)
    length, n, width = xw.shape
    size = width // 4
    _check_shapes("forward", length, n, size, h0=(h0.shape, (n, size)),
                  c0=(c0.shape, (n, size)), w_hh=(w_hh.shape, (width, size)),
                  bias=((width,) if bias is None else bias.shape, (width,)))
    h, c0 = np.ascontiguousarray(h0), np.ascontiguousarray(c0)
    w_t = np.ascontiguousarray(w_hh.T)
    blocks = _column_blocks(n, size, width)
    consts = _constants(bias, size)
    gates = xw if overwrite_xw and xw.flags.c_contiguous else np.array(xw, order="C")
    pre = np.empty((n, width), xw.dtype)
    cs, tanh_cs = (np.empty((length, n, size), xw.dtype) for _ in range(2))
    out = np.empty((length + 1, n, size), xw.dtype)
    back = -1 if reverse else 1  # step t reads the h and c of step t - back
    for t in _steps(length, reverse):
        _product(h, w_t, pre, blocks)
        _forward_kernel(t, t - back, pre, consts, c0, gates, cs, tanh_cs, out)
        h = out[t]
    out[length] = cs[0 if reverse else length - 1]  # the last step's c
    return gates, cs, tanh_cs, out


def backward(grad, gates, cs, tanh_cs, c0, w_hh, reverse, need_dh0=True):
    """LSTMSequence's backward over all T steps: (d_gates (T, N, 4H), dh0,
    dc0) from the output gradient ``grad`` (T + 1, N, H: each step's h, then
    the last c), the saved activated gates (T, N, 4H), cells cs and tanh(cs)
    (T, N, H), c0 (N, H) and w_hh (4H, H), all float32; ``reverse``: the steps
    ran from T-1 down to 0. ``need_dh0`` False: dh0 is None (the last
    step's product skipped)."""
    check_target("LSTM backward", grad, gates, cs, tanh_cs, c0, w_hh)
    _check_float32("backward", grad=grad, gates=gates, cs=cs, tanh_cs=tanh_cs, c0=c0,
                   w_hh=w_hh)
    length, n, size = cs.shape
    _check_shapes("backward", length, n, size, grad=(grad.shape, (length + 1, n, size)),
                  gates=(gates.shape, (length, n, 4 * size)),
                  tanh_cs=(tanh_cs.shape, cs.shape), c0=(c0.shape, (n, size)),
                  w_hh=(w_hh.shape, (4 * size, size)))
    grad, gates, cs, tanh_cs, c0, w_hh = (np.ascontiguousarray(a)
                                          for a in (grad, gates, cs, tanh_cs, c0, w_hh))
    blocks = _column_blocks(n, 4 * size, size)
    d_gates = np.empty_like(gates)
    dh = np.zeros_like(c0)
    dc = grad[length].copy()
    back = -1 if reverse else 1  # step t read the c of step t - back
    steps = _steps(length, not reverse)
    for t in steps:
        _backward_kernel(t, t - back, grad, dh, dc, gates, cs, c0, tanh_cs, d_gates)
        if need_dh0 or t != steps[-1]:
            _product(d_gates[t], w_hh, dh, blocks)
    return d_gates, (dh if need_dh0 else None), dc


def warmup(dtype):
    """Compile the kernels (float32 only: ``takes``)."""
    if np.dtype(dtype) != np.float32:
        return
    a, b = np.zeros((1, 1, 4), dtype), np.zeros((1, 1, 1), dtype)
    forward(a.copy(), b[0], b[0], np.zeros((4, 1), dtype), False, overwrite_xw=True)
    backward(np.zeros((2, 1, 1), dtype), a, b, b, b[0], np.zeros((4, 1), dtype), False)
