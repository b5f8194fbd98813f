"""The LSTM cell's backward: one pass per time step.

``ops.rnn.LSTMSequence``'s backward runs, per step in reverse, this pass over
(N, H) and one product d_gates W_hh (the gradient at the step before's h).
The pass reads the step's saved activated gates (N, 4H; PyTorch's layout:
i, f, g, o blocks of H), c_prev and tanh(c), adds the incoming gradient at h,
and writes the gradients of the four gates' pre-activations and the cell
gradient carried to the step before. The xp code does the same in five NumPy
passes per step after about twenty passes over all steps (ops/rnn.py). Which
arrays take it: dispatch.py.
"""
import numpy as np

from ._cpu import CpuKernel
from ._numba import prange
from ._target import check_target


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


_backward_kernel = CpuKernel(_backward_step)


def backward(grad, gates, cs, tanh_cs, c0, w_hh, reverse):
    """LSTMSequence's backward over all T steps: (d_gates (T, N, 4H), dh0,
    dc0) from the output gradient ``grad`` (T + 1, N, H: each step's h, then
    the last c), the saved activated gates (T, N, 4H), cells cs and tanh(cs)
    (T, N, H), c0 (N, H) and w_hh (4H, H); ``reverse``: the steps ran from
    T-1 down to 0."""
    check_target("LSTM backward", grad, gates, cs, tanh_cs, c0, w_hh)
    length, n, size = cs.shape
    shapes = {"grad": (grad.shape, (length + 1, n, size)),
              "gates": (gates.shape, (length, n, 4 * size)),
              "tanh_cs": (tanh_cs.shape, cs.shape), "c0": (c0.shape, (n, size)),
              "w_hh": (w_hh.shape, (4 * size, size))}
    for name, (got, want) in shapes.items():
        if tuple(got) != want:
            raise ValueError(f"LSTM backward kernels: {name} has shape {tuple(got)}, "
                             f"expected {want} for T={length}, N={n}, H={size}")
    grad, gates, cs, tanh_cs, c0 = (np.ascontiguousarray(a)
                                    for a in (grad, gates, cs, tanh_cs, c0))
    d_gates = np.empty_like(gates)
    dh = np.zeros_like(c0)
    dc = grad[length].copy()
    back = -1 if reverse else 1  # step t read the c of step t - back
    for t in (range(length) if reverse else range(length - 1, -1, -1)):
        _backward_kernel(t, t - back, grad, dh, dc, gates, cs, c0, tanh_cs, d_gates)
        np.matmul(d_gates[t], w_hh, out=dh)
    return d_gates, dh, dc


def warmup(dtype):
    """Compile the kernel for ``dtype``."""
    a, b = np.zeros((1, 1, 4), dtype), np.zeros((1, 1, 1), dtype)
    backward(np.zeros((2, 1, 1), dtype), a, b, b, b[0], np.zeros((4, 1), dtype), False)
