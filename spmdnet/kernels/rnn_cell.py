"""The LSTM recurrence's steps with the pointwise math in few passes.

``ops.rnn.LSTMSequence`` takes these for NumPy arrays (dispatch.py); both
give its xp code's results bit for bit (the same float operations in the
same order, tanh from NumPy), in fewer passes and NumPy calls per step:

- ``forward``: per step the product h W_hhᵀ into the step's (N, 4H) gate
  rows (PyTorch's layout: i, f, g, o blocks of H; W_hhᵀ copied contiguous
  once: BLAS's transposed-operand path is slower at these sizes), one pass
  adding the input projection and halving the sigmoid gates' rows, NumPy's
  tanh over all four gates (sigmoid(a) = tanh(a / 2) / 2 + 1/2), one pass
  for the sigmoid gates and c = f c_prev + i g, then tanh(c) and h = o
  tanh(c): 5 calls against the xp code's 11 (benchmarks/lstm_step.py).
- ``backward``: per step in reverse one pass over (N, H) that adds the
  incoming gradient at h and writes the gradients of the four gates'
  pre-activations and the cell gradient carried to the step before, then
  the product d_gates W_hh (the gradient at the previous h). The xp code
  runs five passes per step after about twenty over all steps.
"""
import numpy as np

from ._cpu import CpuKernel
from ._numba import prange
from ._target import check_target


def _gate_inputs(pre, xw, scale):
    """pre = (pre + xw) * scale, in place over the step's (N, 4H) rows."""
    n, width = pre.shape
    for r in prange(n):
        p, x = pre[r], xw[r]
        for j in range(width):
            p[j] = (p[j] + x[j]) * scale[j]


def _cell(gates, c_prev, c):
    """Over tanh'd gate rows (N, 4H): i, f, o = tanh / 2 + 1/2 in place, and
    c = f c_prev + i g."""
    half = gates.dtype.type(0.5)
    n, size = c.shape
    for r in prange(n):
        p, cp, cr = gates[r], c_prev[r], c[r]
        for k in range(size):
            i = half * p[k] + half
            f = half * p[size + k] + half
            p[k], p[size + k] = i, f
            p[3 * size + k] = half * p[3 * size + k] + half
            cr[k] = f * cp[k] + i * p[2 * size + k]


def _backward_step(t, before, grad, dh, dc, gates, cs, c0, tanh_cs, d_gates):
    """Step t of backpropagation through time: dh (N, H) + grad[t] is the
    gradient at the step's h, dc (N, H) at its c; writes the gradients of the
    gates' pre-activations into d_gates[t] (N, 4H) and into dc (in place) the
    gradient at the c the step read: cs[before], or c0 when ``before`` is
    outside the T steps."""
    one = gates.dtype.type(1)
    n, size = dc.shape
    c_prev = cs[before] if 0 <= before < cs.shape[0] else c0
    gate, d_gate, tanh_c, g_t = gates[t], d_gates[t], tanh_cs[t], grad[t]
    for r in prange(n):
        for k in range(size):
            i, f = gate[r, k], gate[r, size + k]
            g, o = gate[r, 2 * size + k], gate[r, 3 * size + k]
            th = tanh_c[r, k]
            d_h = dh[r, k] + g_t[r, k]
            d_c = dc[r, k] + d_h * (o * (one - th * th))
            d_gate[r, k] = d_c * (g * i * (one - i))
            d_gate[r, size + k] = d_c * (c_prev[r, k] * f * (one - f))
            d_gate[r, 2 * size + k] = d_c * (i * (one - g * g))
            d_gate[r, 3 * size + k] = d_h * (th * o * (one - o))
            dc[r, k] = d_c * f


_gate_inputs_kernel = CpuKernel(_gate_inputs)
_cell_kernel = CpuKernel(_cell)
_backward_kernel = CpuKernel(_backward_step)


def _check_shapes(what, length, n, size, **arrays):
    """Each named array's shape against its expected one: ValueError naming it."""
    for name, (got, want) in arrays.items():
        if tuple(got) != want:
            raise ValueError(f"LSTM {what} kernels: {name} has shape {tuple(got)}, "
                             f"expected {want} for T={length}, N={n}, H={size}")


def _steps(length, reverse):
    return range(length - 1, -1, -1) if reverse else range(length)


def forward(xw, h0, c0, w_hh, reverse):
    """LSTMSequence's forward over all T steps: (gates (T, N, 4H) activated,
    cs, tanh(cs), hs (each (T, N, H))) from the input projection xw (T, N, 4H,
    both biases in), h0, c0 (N, H) and w_hh (4H, H); ``reverse``: the steps
    run from T-1 down to 0 (outputs stay in time order)."""
    check_target("LSTM forward", xw, h0, c0, w_hh)
    length, n, width = xw.shape
    size = width // 4
    _check_shapes("forward", length, n, size, h0=(h0.shape, (n, size)),
                  c0=(c0.shape, (n, size)), w_hh=(w_hh.shape, (width, size)))
    xw, h, c = (np.ascontiguousarray(a) for a in (xw, h0, c0))
    w_t = np.ascontiguousarray(w_hh.T)
    scale = np.full(width, 0.5, xw.dtype)
    scale[2 * size:3 * size] = 1  # g's tanh takes its input unhalved
    gates = np.empty_like(xw)
    cs, tanh_cs, hs = (np.empty((length, n, size), xw.dtype) for _ in range(3))
    for t in _steps(length, reverse):
        pre = np.matmul(h, w_t, out=gates[t])
        _gate_inputs_kernel(pre, xw[t], scale)
        np.tanh(pre, out=pre)
        _cell_kernel(pre, c, cs[t])
        np.tanh(cs[t], out=tanh_cs[t])
        np.multiply(pre[:, 3 * size:], tanh_cs[t], out=hs[t])
        h, c = hs[t], cs[t]
    return gates, cs, tanh_cs, hs


def backward(grad, gates, cs, tanh_cs, c0, w_hh, reverse):
    """LSTMSequence's backward over all T steps: (d_gates (T, N, 4H), dh0,
    dc0) from the output gradient ``grad`` (T + 1, N, H: each step's h, then
    the last c), the saved activated gates (T, N, 4H), cells cs and tanh(cs)
    (T, N, H), c0 (N, H) and w_hh (4H, H); ``reverse``: the steps ran from
    T-1 down to 0."""
    check_target("LSTM backward", grad, gates, cs, tanh_cs, c0, w_hh)
    length, n, size = cs.shape
    _check_shapes("backward", length, n, size, grad=(grad.shape, (length + 1, n, size)),
                  gates=(gates.shape, (length, n, 4 * size)),
                  tanh_cs=(tanh_cs.shape, cs.shape), c0=(c0.shape, (n, size)),
                  w_hh=(w_hh.shape, (4 * size, size)))
    grad, gates, cs, tanh_cs, c0 = (np.ascontiguousarray(a)
                                    for a in (grad, gates, cs, tanh_cs, c0))
    d_gates = np.empty_like(gates)
    dh = np.zeros_like(c0)
    dc = grad[length].copy()
    back = -1 if reverse else 1  # step t read the c of step t - back
    for t in _steps(length, not reverse):
        _backward_kernel(t, t - back, grad, dh, dc, gates, cs, c0, tanh_cs, d_gates)
        np.matmul(d_gates[t], w_hh, out=dh)
    return d_gates, dh, dc


def warmup(dtype):
    """Compile the kernels for ``dtype``."""
    a, b = np.zeros((1, 1, 4), dtype), np.zeros((1, 1, 1), dtype)
    forward(a, b[0], b[0], np.zeros((4, 1), dtype), False)
    backward(np.zeros((2, 1, 1), dtype), a, b, b, b[0], np.zeros((4, 1), dtype), False)
