"""The LSTM recurrence's float32 kernels (kernels/rnn_cell.py) against the op's xp code.

The kernels compute tanh with their own float32 approximation (``_tanh``), so
they match the xp code (NumPy's tanh) to float32 rounding, not bit for bit:
``_tanh`` is checked within 8 ulp of float64 tanh over its whole range, and
the op's output and every input gradient in float32 with the kernels against
the xp code in float64 (itself checked against finite differences here),
both directions, with and without the bias, at a real width (H 256), an odd
one (257), tiny shapes and nn.LSTM(200, 200)'s step (N 20: the products in
column blocks); then nn.LSTM in float32 (two bidirectional layers) against the
float64 module. Also: writing the gates over xw changes nothing else, the
skipped last product when h0 needs no gradient changes no other gradient, and
the table hands the kernels out for float32 NumPy arrays only.
"""
import numpy as np
import pytest

import spmdnet as sn
from spmdnet import kernels, nn
from spmdnet.autograd import gradcheck
from spmdnet.kernels import rnn_cell
from spmdnet.ops.rnn import LSTMSequence

# (T, N, H); (3, 20, 200): the step products run in column blocks (rnn_cell._column_blocks)
SHAPES = [(1, 1, 1), (3, 2, 3), (5, 3, 256), (4, 2, 257), (3, 20, 200)]


def _inputs(shape, dtype, seed=0, bias=False):
    """xw, h0, c0, w_hh[, bias]."""
    t, n, h = shape
    rng = np.random.default_rng(seed)
    scale = 1 / np.sqrt(h)
    arrays = [rng.standard_normal((t, n, 4 * h)), rng.standard_normal((n, h)),
              rng.standard_normal((n, h)), rng.uniform(-scale, scale, (4 * h, h)) * 2]
    if bias:
        arrays.append(rng.standard_normal(4 * h))
    return [a.astype(dtype) for a in arrays]


def _run(mode, arrays, reverse, overwrite_xw=False, tensors=None):
    """(output, grads of xw, h0, c0, w_hh[, bias]) with kernels ``mode``."""
    tensors = tensors or [sn.tensor(a, requires_grad=True) for a in arrays]
    weights = np.random.default_rng(1).standard_normal(
        (arrays[0].shape[0] + 1,) + arrays[1].shape).astype(arrays[0].dtype)
    with kernels.use(mode):
        out = LSTMSequence.apply(*tensors, reverse=reverse, overwrite_xw=overwrite_xw)
        (out * sn.tensor(weights)).sum().backward()
    return [out.numpy()] + [t.grad.numpy() for t in tensors]


def _ulps(got, want):
    """|got - want| in float32 ulps at want (want float64)."""
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


def _g_gate(x):
    """tanh(x) as the forward kernel computes it (FMA contraction on): the g
    gate of one step with H = 1, zero state and zero recurrent weights."""
    xw = np.zeros((1, len(x), 4), np.float32)
    xw[0, :, 2] = x
    zero = np.zeros((len(x), 1), np.float32)
    return rnn_cell.forward(xw, zero, zero, np.zeros((4, 1), np.float32), False)[0][0, :, 2]


def test_tanh_in_the_forward_kernel_within_5_ulp_of_float64_tanh():
    x = np.concatenate([np.linspace(-12, 12, 48001), np.geomspace(1e-30, 1, 2000),
                        -np.geomspace(1e-30, 1, 2000)]).astype(np.float32)
    got = _g_gate(x)
    want = np.tanh(x.astype(np.float64))
    assert _ulps(got, want).max() <= 5  # 4.8 measured on a finer grid (rnn_cell.py)
    assert np.abs(got).max() <= 1 and np.array_equal(got, -_g_gate(-x))
    out = _g_gate(np.array([np.inf, -np.inf, np.nan, 0.0, 9.0, 9.005, 9.02], np.float32))
    assert out[0] == 1 and out[1] == -1 and np.isnan(out[2]) and out[3] == 0
    # clamped at 9: float32 tanh is 0.99999994 up to about 9.01, then 1
    assert _ulps(out[4:6], np.tanh(np.float64([9.0, 9.005]))).max() <= 1 and out[6] == 1


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_float32_kernels_match_the_float64_xp_code(shape, reverse, bias):
    arrays = _inputs(shape, np.float32, bias=bias)
    got = _run("numba", arrays, reverse)
    want = _run("xp", [a.astype(np.float64) for a in arrays], reverse)
    xp32 = _run("xp", arrays, reverse)
    assert len(got) == 5 + bias
    names = ("out", "d_xw", "d_h0", "d_c0", "d_w_hh", "d_bias")
    for name, a, b, c in zip(names, got, want, xp32):
        assert a.dtype == np.float32, name
        scale = np.abs(b).max()
        # within a few float32 roundings of the float64 result, as the xp code in float32
        assert np.abs(a - b).max() <= 2e-6 * scale * shape[0], name
        assert np.abs(a - b).max() <= 4 * np.abs(c - b).max() + 5e-7 * scale, name
    assert np.abs(got[1]).max() > 0 and np.abs(got[4]).max() > 0  # gradients flowed


def test_column_blocks_cover_the_product():
    assert rnn_cell._column_blocks(20, 200, 800) == [(0, 200), (200, 400), (400, 600),
                                                      (600, 800)]
    assert rnn_cell._column_blocks(20, 800, 200) == [(0, 50), (50, 100), (100, 150), (150, 200)]
    assert rnn_cell._column_blocks(3, 256, 1024) == [(0, 1024)]
    assert rnn_cell._column_blocks(64, 512, 2048) == [(0, 2048)]  # > 8 blocks: whole


@pytest.mark.parametrize("reverse", [False, True])
def test_kernels_without_h0_gradient_give_the_same_other_gradients(reverse):
    """The last step's product (dh0) is skipped when h0 needs no gradient."""
    arrays = _inputs((4, 20, 200), np.float32, bias=True)
    full = _run("numba", arrays, reverse)
    tensors = [sn.tensor(a, requires_grad=i != 1) for i, a in enumerate(arrays)]
    weights = np.random.default_rng(1).standard_normal((5, 20, 200)).astype(np.float32)
    with kernels.use("numba"):
        (LSTMSequence.apply(*tensors, reverse=reverse) * sn.tensor(weights)).sum().backward()
    assert tensors[1].grad is None
    for i in (0, 2, 3, 4):
        np.testing.assert_array_equal(tensors[i].grad.numpy(), full[1 + i])


@pytest.mark.parametrize("mode", ["numba", "xp"])
def test_overwrite_xw_changes_only_where_the_gates_live(mode):
    """overwrite_xw=True: the same output and gradients, the gates written over
    xw's array; without it the op leaves xw as it was."""
    arrays = _inputs((3, 4, 5), np.float32, bias=True)
    for overwrite in (False, True):
        tensors = [sn.tensor(a, requires_grad=True) for a in arrays]
        got = _run(mode, arrays, False, overwrite, tensors)
        xw = tensors[0].numpy()
        if not overwrite:
            np.testing.assert_array_equal(xw, arrays[0])
            kept = got
    assert not np.array_equal(xw, arrays[0]) and np.all((xw >= -1) & (xw <= 1))  # gates
    for a, b in zip(got, kept):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("reverse", [False, True])
def test_xp_code_against_finite_differences(reverse):
    arrays = _inputs((4, 2, 3), np.float64, seed=2, bias=True)

    def fn(*tensors):
        with kernels.use("xp"):
            return LSTMSequence.apply(*tensors, reverse=reverse)
    gradcheck(fn, *arrays)


def test_float32_lstm_module_matches_the_float64_module():
    """Two bidirectional layers with both states given, output and final
    states, and the gradients of every parameter, the input and the states."""
    rng = np.random.default_rng(3)
    sn.manual_seed(0)
    ours = nn.LSTM(5, 6, num_layers=2, bidirectional=True)
    ref = nn.LSTM(5, 6, num_layers=2, bidirectional=True).double()
    ref.load_state_dict({k: v.numpy().astype(np.float64) for k, v in ours.state_dict().items()})
    arrays = [rng.standard_normal(s) for s in ((7, 3, 5), (4, 3, 6), (4, 3, 6))]
    w_out = rng.standard_normal((7, 3, 12))
    results = []
    for module, dtype in ((ours, np.float32), (ref, np.float64)):
        x, h0, c0 = (sn.tensor(a.astype(dtype), requires_grad=True) for a in arrays)
        with kernels.use("numba"):
            out, (h, c) = module(x, (h0, c0))
            ((out * sn.tensor(w_out.astype(dtype))).sum() + (h * c).sum()).backward()
        results.append([out.numpy(), h.numpy(), c.numpy(), x.grad.numpy(), h0.grad.numpy(),
                        c0.grad.numpy()] + [p.grad.numpy() for p in module.parameters()])
    for a, b in zip(*results):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5 * np.abs(b).max())


def test_table_hands_the_kernels_out_for_numpy_float32_only():
    arrays = _inputs((2, 1, 2), np.float32, bias=True)
    with kernels.use("numba"):
        assert kernels.lookup("lstm", *arrays) is rnn_cell.forward
        assert kernels.lookup("lstm", *arrays[:4]) is rnn_cell.forward
        assert kernels.lookup("lstm", *arrays, step="backward") is rnn_cell.backward
        for dtype in (np.float64, np.float16):
            assert kernels.lookup("lstm", *_inputs((2, 1, 2), dtype, bias=True)) is None
    with kernels.use("xp"):
        assert kernels.lookup("lstm", *arrays) is None


def test_kernels_name_the_wrong_array():
    xw, h0, c0, w = _inputs((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"w_hh has shape \(16, 5\)"):
        rnn_cell.forward(xw, h0, c0, np.zeros((16, 5), np.float32), False)
    with pytest.raises(ValueError, match=r"c0 has shape \(3, 5\)"):
        rnn_cell.forward(xw, h0, np.zeros((3, 5), np.float32), w, False)
    with pytest.raises(TypeError, match="float32 or float64"):
        rnn_cell.forward(xw, h0, c0.astype(np.float64), w, False)
    with pytest.raises(ValueError, match=r"bias has shape \(15,\)"):
        rnn_cell.forward(xw, h0, c0, w, False, np.zeros(15, np.float32))
    with pytest.raises(TypeError, match="xw is float64"):
        rnn_cell.forward(*(a.astype(np.float64) for a in (xw, h0, c0, w)), False)
    gates, cs, tanh_cs, _ = rnn_cell.forward(xw, h0, c0, w, False)
    with pytest.raises(ValueError, match=r"grad has shape \(2, 3, 4\)"):
        rnn_cell.backward(np.zeros((2, 3, 4), np.float32), gates, cs, tanh_cs, c0, w, False)
