"""The LSTM recurrence's kernels (kernels/rnn_cell.py) against the op's xp code.

The kernels promise the xp code's numbers bit for bit (the same float
operations in the same order): checked on the op's output and every input
gradient, both directions, float32 and float64, at a real width (H 256), an
odd one (257) and tiny shapes. Both paths are also checked against float64
finite differences, and the table hands the kernels out only where it says.
"""
import numpy as np
import pytest

import spmdnet as sn
from spmdnet import kernels
from spmdnet.autograd import gradcheck
from spmdnet.kernels import rnn_cell
from spmdnet.ops.rnn import LSTMSequence

SHAPES = [(1, 1, 1), (3, 2, 3), (5, 3, 256), (4, 2, 257)]  # (T, N, H)


def _inputs(shape, dtype, seed=0):
    t, n, h = shape
    rng = np.random.default_rng(seed)
    scale = 1 / np.sqrt(h)
    return [rng.standard_normal((t, n, 4 * h)).astype(dtype),
            rng.standard_normal((n, h)).astype(dtype),
            rng.standard_normal((n, h)).astype(dtype),
            (rng.uniform(-scale, scale, (4 * h, h)) * 2).astype(dtype)]


def _run(mode, arrays, reverse):
    """(output, grads of xw, h0, c0, w_hh) with kernels ``mode``."""
    tensors = [sn.tensor(a, requires_grad=True) for a in arrays]
    weights = np.random.default_rng(1).standard_normal(
        (arrays[0].shape[0] + 1,) + arrays[1].shape).astype(arrays[0].dtype)
    with kernels.use(mode):
        out = LSTMSequence.apply(*tensors, reverse=reverse)
        (out * sn.tensor(weights)).sum().backward()
    return [out.numpy()] + [t.grad.numpy() for t in tensors]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_kernels_give_the_xp_codes_bits(shape, dtype, reverse):
    arrays = _inputs(shape, dtype)
    got, want = _run("numba", arrays, reverse), _run("xp", arrays, reverse)
    for name, a, b in zip(("out", "d_xw", "d_h0", "d_c0", "d_w_hh"), got, want):
        assert a.dtype == dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert np.abs(got[1]).max() > 0 and np.abs(got[4]).max() > 0  # gradients flowed


@pytest.mark.parametrize("mode", ["numba", "xp"])
@pytest.mark.parametrize("reverse", [False, True])
def test_both_paths_against_finite_differences(mode, reverse):
    arrays = _inputs((4, 2, 3), np.float64, seed=2)

    def fn(*tensors):
        with kernels.use(mode):
            return LSTMSequence.apply(*tensors, reverse=reverse)
    gradcheck(fn, *arrays)


def test_table_hands_the_kernels_out_for_numpy_floats_only():
    for dtype in (np.float32, np.float64):
        arrays = _inputs((2, 1, 2), dtype)
        with kernels.use("numba"):
            assert kernels.lookup("lstm", *arrays) is rnn_cell.forward
            assert kernels.lookup("lstm", *arrays, step="backward") is rnn_cell.backward
        with kernels.use("xp"):
            assert kernels.lookup("lstm", *arrays) is None
    with kernels.use("numba"):
        assert kernels.lookup("lstm", *_inputs((2, 1, 2), np.float16)) is None


def test_kernels_name_the_wrong_array():
    xw, h0, c0, w = _inputs((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"w_hh has shape \(16, 5\)"):
        rnn_cell.forward(xw, h0, c0, np.zeros((16, 5), np.float32), False)
    with pytest.raises(ValueError, match=r"c0 has shape \(3, 5\)"):
        rnn_cell.forward(xw, h0, np.zeros((3, 5), np.float32), w, False)
    with pytest.raises(TypeError, match="float32 or float64"):
        rnn_cell.forward(xw, h0, c0.astype(np.float64), w, False)
    gates, cs, tanh_cs, _ = rnn_cell.forward(xw, h0, c0, w, False)
    with pytest.raises(ValueError, match=r"grad has shape \(2, 3, 4\)"):
        rnn_cell.backward(np.zeros((2, 3, 4), np.float32), gates, cs, tanh_cs, c0, w, False)
