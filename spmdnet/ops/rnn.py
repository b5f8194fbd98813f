"""The recurrences of nn.RNN, nn.LSTM and nn.GRU: one op per layer and direction.

The input projection of every time step is one product outside the op
(``F.linear`` over the whole (T, N, I) sequence); the op runs only what must
be sequential: per step one (N, H) x (H, G·H) product and the gates'
pointwise math. Backward walks the steps in reverse (backpropagation through
time) and forms the recurrent weight's gradient as one product over all steps.
This keeps the autograd graph at a handful of nodes per layer whatever T is.

Gate layouts are PyTorch's: LSTM rows (i, f, g, o), GRU rows (r, z, n) with
``n = tanh(x_n + r * (W_hn h + b_hn))``. ``reverse=True`` runs the steps from
T-1 down to 0 (the reverse direction of a bidirectional layer); outputs stay
in time order. Inputs and outputs, by op:

- ``ElmanSequence(xw, h0, w_hh, nonlinearity=)`` -> hs (T, N, H);
  ``xw = x W_ihᵀ + b_ih + b_hh``.
- ``LSTMSequence(xw, h0, c0, w_hh[, bias])`` -> (T + 1, N, H): rows 0..T-1
  the h of each step, row T the last cell state; ``xw = x W_ihᵀ``, and
  ``bias = b_ih + b_hh`` (4H,) when given, added inside (with the kernels in
  the step's pass, not as one more pass over xw).
- ``GRUSequence(xw, h0, w_hh, b_hh)`` -> hs (T, N, H); ``xw = x W_ihᵀ + b_ih``
  (b_hh stays inside, as r multiplies W_hn h + b_hn).

The pointwise math is plain xp, arranged so that each step runs few array
passes: one tanh over all four LSTM gates (sigmoid(a) = tanh(a/2)/2 + 1/2),
and in backward every gate derivative that does not depend on the incoming
gradient computed for all steps at once before the loop (``_factors``), so a
step multiplies them in place (LSTM: 5 passes and the product). The
recurrent product runs on a contiguous copy of W_hhᵀ (BLAS's transposed
path is slower at these sizes). For float32 NumPy arrays the LSTM takes
kernels/rnn_cell.py instead (``kernels.lookup("lstm")``): one kernel per
step after the product, forward and backward, with its own float32 tanh, so
the same numbers up to float32 rounding (tests/test_rnn_kernels.py; speed:
benchmarks/lstm_step.py).
"""
from .. import kernels
from ..autograd.function import Function
from ..backend import xp_of


def _sigmoid_(a, xp):
    """sigmoid(a) in place: 0.5 tanh(a / 2) + 0.5 (no overflow for large |a|)."""
    a *= 0.5
    xp.tanh(a, out=a)
    a *= 0.5
    a += 0.5
    return a


def _steps(length, reverse):
    return range(length - 1, -1, -1) if reverse else range(length)


def _previous_states(hs, h0, reverse):
    """(T, N, H): the state each step read, in time order."""
    xp = xp_of(hs)
    if reverse:
        return xp.concatenate([hs[1:], h0[None]])
    return xp.concatenate([h0[None], hs[:-1]])


class _Sequence(Function):
    """Shared by the three recurrences: the time loop's bookkeeping."""

    def _loop_forward(self, xw, h0, w_hh, reverse, step, products=None):
        """Runs ``step(t, h W_hhᵀ, h, hs)`` for each t; the products go into
        ``products[t]`` when given (a (T, N, G·H) array the op keeps)."""
        xp = xp_of(xw)
        self.w_hh, self.h0, self.reverse = w_hh, h0, reverse
        # h (N, H) x W_hhᵀ as a plain product on a (H, G·H) copy: BLAS's
        # transposed-operand path measured up to 2x slower at these sizes
        # (OpenBLAS's AVX-512 kernels, N=20, H=200); the copy is one pass
        w_t = xp.ascontiguousarray(w_hh.T)
        hs = xp.empty(xw.shape[:2] + (h0.shape[-1],), xw.dtype)
        h = h0
        for t in _steps(xw.shape[0], reverse):
            pre = xp.matmul(h, w_t, out=None if products is None else products[t])
            step(t, pre, h, hs)
            h = hs[t]
        self.hs = hs
        return hs

    def _weight_grad(self, d_pre, index):
        """Σ_t d_pre[t]ᵀ h_prev[t] (None when input ``index``, the weight, needs
        no gradient): one product over the T - 1 steps that read an h of the
        sequence, plus the step that read h0 (no (T, N, H) copy of the
        previous states)."""
        if not self.needs_input_grad[index]:
            return None
        gates, size = d_pre.shape[-1], self.hs.shape[-1]
        if self.reverse:  # step t read hs[t + 1]; step T-1 read h0
            inner, first, prev = d_pre[:-1], d_pre[-1], self.hs[1:]
        else:  # step t read hs[t - 1]; step 0 read h0
            inner, first, prev = d_pre[1:], d_pre[0], self.hs[:-1]
        grad = inner.reshape(-1, gates).T @ prev.reshape(-1, size)
        grad += first.T @ self.h0
        return grad


class ElmanSequence(_Sequence):
    """h_t = act(xw_t + h_{t-1} W_hhᵀ), act tanh or relu."""

    def forward(self, xw, h0, w_hh, nonlinearity="tanh", reverse=False):
        xp = xp_of(xw)
        self.relu = nonlinearity == "relu"

        def step(t, pre, h, hs):
            pre += xw[t]
            if self.relu:
                xp.maximum(pre, 0, out=hs[t])
            else:
                xp.tanh(pre, out=hs[t])

        return self._loop_forward(xw, h0, w_hh, reverse, step).copy()

    def backward(self, grad):
        xp = xp_of(grad)
        hs = self.hs
        # act' for every step at once; the loop then multiplies it in place
        d_pre = (hs > 0).astype(hs.dtype) if self.relu else 1 - hs * hs
        dh = xp.zeros_like(self.h0)
        for t in _steps(hs.shape[0], not self.reverse):
            dh += grad[t]
            d_pre[t] *= dh
            dh = d_pre[t] @ self.w_hh
        return d_pre, dh, self._weight_grad(d_pre, 2)


def _gate_constants(dtype, xp):
    """(scale, mult, add), each (4, 1): one tanh over all four LSTM gates
    gives sigmoid(a) = 0.5 tanh(a / 2) + 0.5 for i, f, o and tanh(a) for g."""
    scale = xp.asarray([[0.5], [0.5], [1.0], [0.5]], dtype)
    return scale, scale, xp.asarray([[0.5], [0.5], [0.0], [0.5]], dtype)


class LSTMSequence(_Sequence):
    """c_t = f c_{t-1} + i g, h_t = o tanh(c_t), gates from xw_t + h_{t-1} W_hhᵀ."""

    def forward(self, xw, h0, c0, w_hh, *bias, reverse=False, overwrite_xw=False):
        """``overwrite_xw=True``: the op may write its gates over the array of
        xw (the caller's fresh input product, read by no one else)."""
        xp = xp_of(xw)
        length, (n, size) = xw.shape[0], c0.shape
        self.c0, self.w_hh, self.h0, self.reverse = c0, w_hh, h0, reverse
        self.with_bias = bool(bias)
        self.cell_backward = kernels.lookup("lstm", xw, h0, c0, w_hh, *bias, step="backward")
        kernel = kernels.lookup("lstm", xw, h0, c0, w_hh, *bias)
        if kernel is not None:  # kernels/rnn_cell.py: float32, one kernel per step
            self.gates, self.cs, self.tanh_cs, out = kernel(
                xw, h0, c0, w_hh, reverse, *bias, overwrite_xw=overwrite_xw)
            self.hs = out[:length]
            return out
        if bias:
            xw = xp.add(xw, bias[0], out=xw if overwrite_xw else None)
        # activated gates, per step: over xw, or the products' own array
        self.gates = xw if overwrite_xw else xp.empty_like(xw)
        self.cs = xp.empty((length, n, size), xw.dtype)
        self.tanh_cs = xp.empty_like(self.cs)
        scale, mult, add = _gate_constants(xw.dtype, xp)
        c_prev = [c0]

        def step(t, pre, h, hs):  # pre: self.gates[t], or h W_hhᵀ over xw
            if overwrite_xw:
                pre = xp.add(xw[t], pre, out=xw[t])
            else:
                pre += xw[t]
            quad = pre.reshape(n, 4, size)
            quad *= scale
            xp.tanh(pre, out=pre)
            quad *= mult
            quad += add
            i, f, g, o = (quad[:, k] for k in range(4))
            c = self.cs[t]
            xp.multiply(f, c_prev[0], out=c)
            c += i * g
            xp.tanh(c, out=self.tanh_cs[t])
            xp.multiply(o, self.tanh_cs[t], out=hs[t])
            c_prev[0] = c

        hs = self._loop_forward(xw, h0, w_hh, reverse, step,
                                products=None if overwrite_xw else self.gates)
        return xp.concatenate([hs, c_prev[0][None]])

    def _factors(self, xp):
        """What does not depend on the incoming gradient, for every step at
        once: (dc/dh at each step's output (T, N, H), the gates' derivatives
        (T, N, 4, H), to be multiplied by dc for i, f, g and by dh for o)."""
        length, n, size = self.cs.shape
        i, f, g, o = (self.gates.reshape(length, n, 4, size)[:, :, k] for k in range(4))
        tanh_c = self.tanh_cs
        c_prev = _previous_states(self.cs, self.c0, self.reverse)
        factors = xp.empty((length, n, 4, size), self.gates.dtype)
        factors[:, :, 0] = g * i * (1 - i)
        factors[:, :, 1] = c_prev * f * (1 - f)
        factors[:, :, 2] = i * (1 - g * g)
        factors[:, :, 3] = tanh_c * o * (1 - o)
        return o * (1 - tanh_c * tanh_c), factors, f

    def backward(self, grad):
        if self.cell_backward is not None:  # kernels/rnn_cell.py: one pass per step
            d_gates, dh, dc = self.cell_backward(grad, self.gates, self.cs, self.tanh_cs,
                                                 self.c0, self.w_hh, self.reverse,
                                                 self.needs_input_grad[1])
            return (d_gates, dh, dc, self._weight_grad(d_gates, 3)) + self._bias_grad(d_gates)
        xp = xp_of(grad)
        length = self.hs.shape[0]
        dc_dh, d_gates, f = self._factors(xp)  # d_gates: multiplied in place below
        dh = xp.zeros_like(self.h0)
        dc = xp.array(grad[length])
        for t in _steps(length, not self.reverse):
            dh += grad[t]
            dc += dh * dc_dh[t]
            d_gates[t, :, :3] *= dc[:, None, :]
            d_gates[t, :, 3] *= dh
            dc *= f[t]
            dh = d_gates[t].reshape(dh.shape[0], -1) @ self.w_hh
        d_gates = d_gates.reshape(self.gates.shape)
        return (d_gates, dh, dc, self._weight_grad(d_gates, 3)) + self._bias_grad(d_gates)

    def _bias_grad(self, d_gates):
        """(the bias's gradient,) when the op was given one (else ())."""
        if not self.with_bias:
            return ()
        if not self.needs_input_grad[4]:
            return (None,)
        return (d_gates.reshape(-1, d_gates.shape[-1]).sum(axis=0),)


class GRUSequence(_Sequence):
    """r, z = σ(xw_rz + (h W_hhᵀ + b_hh)_rz), n = tanh(xw_n + r (h W_hnᵀ + b_hn)),
    h_t = (1 - z) n + z h_{t-1}."""

    def forward(self, xw, h0, w_hh, b_hh, reverse=False):
        xp = xp_of(xw)
        size = h0.shape[-1]
        self.gates = xp.empty_like(xw)  # r, z, n after activation
        self.hn = xp.empty(xw.shape[:2] + (size,), xw.dtype)  # W_hn h + b_hn

        def step(t, pre, h, hs):
            pre += b_hh
            self.hn[t] = pre[:, 2 * size:]
            gates = self.gates[t]
            xp.add(xw[t, :, :2 * size], pre[:, :2 * size], out=gates[:, :2 * size])
            _sigmoid_(gates[:, :2 * size], xp)
            r, z, n = gates[:, :size], gates[:, size:2 * size], gates[:, 2 * size:]
            xp.multiply(r, pre[:, 2 * size:], out=n)
            n += xw[t, :, 2 * size:]
            xp.tanh(n, out=n)
            xp.subtract(h, n, out=hs[t])
            hs[t] *= z
            hs[t] += n

        return self._loop_forward(xw, h0, w_hh, reverse, step).copy()

    def _factors(self, xp):
        """d(pre-activation)/dh at each step's output, for every step at once:
        (T, N, 4, H) rows r, z, n on the input side and n's W_hn h + b_hn side."""
        length, n, size = self.hn.shape
        r, z, n_gate = (self.gates.reshape(length, n, 3, size)[:, :, k] for k in range(3))
        h_prev = _previous_states(self.hs, self.h0, self.reverse)
        factors = xp.empty((length, n, 4, size), self.gates.dtype)
        dn = (1 - z) * (1 - n_gate * n_gate)
        factors[:, :, 0] = dn * self.hn * r * (1 - r)
        factors[:, :, 1] = (h_prev - n_gate) * z * (1 - z)
        factors[:, :, 2] = dn
        factors[:, :, 3] = dn * r
        return factors, z

    def backward(self, grad):
        xp = xp_of(grad)
        length, size = self.hs.shape[0], self.h0.shape[-1]
        factors, z = self._factors(xp)  # multiplied by dh in place below
        d_hh = xp.empty_like(self.gates)  # the h W_hhᵀ + b_hh side
        d_hh_quad = d_hh.reshape(factors.shape[:2] + (3, size))
        dh = xp.zeros_like(self.h0)
        for t in _steps(length, not self.reverse):
            dh += grad[t]
            factors[t] *= dh[:, None, :]
            d_hh_quad[t, :, :2] = factors[t, :, :2]
            d_hh_quad[t, :, 2] = factors[t, :, 3]
            dh = dh * z[t] + d_hh[t] @ self.w_hh
        d_x = factors[:, :, :3].reshape(self.gates.shape)
        d_bias = d_hh.sum(axis=(0, 1)) if self.needs_input_grad[3] else None
        return d_x, dh, self._weight_grad(d_hh, 2), d_bias
