"""Batch norm's Numba kernels (spmdnet.kernels.batch_norm, re-exported by
kernels.norm; TABLE row "batch_norm") against the op's plain-xp code
(``kernels.use("xp")``), float64 finite differences, and float64 closed
forms of the float32 statistics.

Shapes: odd (runs of 1 position excepted: those take the xp code), 3-D,
4-D, 5-D and non-contiguous input; training, eval, affine or not, with and
without running statistics, momentum None.
"""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import kernels, nn
from spmdnet.autograd import gradcheck
from spmdnet.kernels import batch_norm as batch_norm_kernels
from spmdnet.kernels import dispatch, norm
from spmdnet.ops import batchnorm

SHAPES = [(3, 5, 7, 9), (2, 3, 5), (4, 3, 2, 3, 2), (5, 2, 1, 17)]


def tol(dtype):
    if np.dtype(dtype) == np.float32:
        return {"rtol": 1e-5, "atol": 2e-6}
    return {"rtol": 1e-12, "atol": 1e-12}


def _data(shape, dtype, seed=0, loc=0.5):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2.0 + loc).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    w = (rng.standard_normal(shape[1]) + 1.0).astype(dtype)
    b = rng.standard_normal(shape[1]).astype(dtype)
    return x, g, w, b


def _run(mode, shape, dtype, training, affine, track, momentum=0.1, steps=2):
    """Outputs, input/weight/bias gradients and running statistics of
    ``steps`` forward+backward passes of a BatchNorm layer under ``mode``."""
    x, g, w, b = _data(shape, dtype)
    cls = {3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[len(shape)]
    bn = cls(shape[1], momentum=momentum, affine=affine, track_running_stats=track,
             dtype=dtype)
    if affine:
        bn.weight.data[...] = w
        bn.bias.data[...] = b
    if track:
        bn.running_mean.data[...] = b
        bn.running_var.data[...] = w * w
    bn.train(training)
    results = []
    with kernels.use(mode):
        for step in range(steps):
            xt = sn.tensor(x + step, requires_grad=True)
            out = bn(xt)
            assert (out._ctx.kernels is not None) == (mode == "numba")
            out.backward(sn.tensor(g))
            results += [out.numpy(), xt.grad.numpy()]
            if affine:
                results += [bn.weight.grad.numpy().copy(), bn.bias.grad.numpy().copy()]
                bn.weight.grad = bn.bias.grad = None
    if track:
        results += [bn.running_mean.numpy(), bn.running_var.numpy()]
    return results


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("training,affine,track", [
    (True, True, True), (True, False, True), (True, True, False), (False, True, True),
    (False, False, True), (False, True, False)])
def test_kernels_match_the_xp_reference(dtype, shape, training, affine, track):
    got = _run("numba", shape, dtype, training, affine, track)
    want = _run("xp", shape, dtype, training, affine, track)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype == dtype
        np.testing.assert_allclose(a, b, **tol(dtype))


def test_momentum_none_with_kernels_matches_xp():
    got = _run("numba", (3, 4, 5, 6), np.float32, True, True, True, momentum=None, steps=3)
    want = _run("xp", (3, 4, 5, 6), np.float32, True, True, True, momentum=None, steps=3)
    for a, b in zip(got[-2:], want[-2:]):  # the cumulative running averages
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(3, 2, 5), (2, 3, 3, 5)])
def test_kernel_gradients_match_finite_differences(training, affine, shape):
    x, _, w, b = _data(shape, np.float64, seed=4)
    rm, rv = sn.tensor(b.copy()), sn.tensor(w * w + 0.5)
    with kernels.use("numba"):
        probe = F.batch_norm(sn.tensor(x, requires_grad=True), rm, rv, training=training)
        assert probe._ctx.kernels is not None

        def fn(x, *affine):
            return F.batch_norm(x, None if training else rm, None if training else rv,
                                *affine, training=training)

        assert gradcheck(fn, x, w, b) if affine else gradcheck(fn, x)


@pytest.mark.parametrize("loc", [0.5, 300.0])
def test_float32_statistics_are_float64_exact_rounded(loc):
    """mean and m2 from float32 input, accumulated in float64, equal the
    float64 closed form to float64 rounding (so float32 results round once)."""
    x = _data((4, 6, 9, 11), np.float32, seed=7, loc=loc)[0]
    mean, m2 = norm.batch_moments(x)
    exact = x.astype(np.float64)
    want_mean = exact.mean(axis=(0, 2, 3))
    want_m2 = ((exact - want_mean[None, :, None, None]) ** 2).sum(axis=(0, 2, 3))
    assert mean.dtype == m2.dtype == np.float64
    np.testing.assert_allclose(mean, want_mean, rtol=1e-13)
    np.testing.assert_allclose(m2, want_m2, rtol=1e-11)


def test_float32_output_and_gradient_against_float64_closed_form():
    x, g, w, b = _data((8, 4, 6, 6), np.float32, seed=8)
    xt = sn.tensor(x, requires_grad=True)
    wt, bt = sn.tensor(w, requires_grad=True), sn.tensor(b, requires_grad=True)
    with kernels.use("numba"):
        out = F.batch_norm(xt, None, None, wt, bt, training=True)
        out.backward(sn.tensor(g))
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    axes, c = (0, 2, 3), (1, -1, 1, 1)
    mean, var = x64.mean(axis=axes), x64.var(axis=axes)
    xhat = (x64 - mean.reshape(c)) / np.sqrt(var.reshape(c) + 1e-5)
    np.testing.assert_allclose(out.numpy(), xhat * w.reshape(c) + b.reshape(c),
                               rtol=2e-6, atol=2e-6)
    gxhat = g64 * w.reshape(c)
    gx = (gxhat - gxhat.mean(axis=axes).reshape(c)
          - xhat * (gxhat * xhat).mean(axis=axes).reshape(c)) / np.sqrt(var.reshape(c) + 1e-5)
    np.testing.assert_allclose(xt.grad.numpy(), gx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(wt.grad.numpy(), (g64 * xhat).sum(axis=axes), rtol=1e-6)
    np.testing.assert_allclose(bt.grad.numpy(), g64.sum(axis=axes), rtol=1e-6)


def test_non_contiguous_input_and_gradient():
    x, g, w, b = _data((3, 6, 4, 5), np.float32, seed=9)
    xs = x.transpose(0, 1, 3, 2)  # (3, 6, 5, 4), not C-contiguous
    gs = np.ascontiguousarray(g.transpose(0, 1, 3, 2))[:, :, ::-1]
    results = []
    for mode in ("numba", "xp"):
        xt = sn.tensor(xs, requires_grad=True)
        with kernels.use(mode):
            out = F.batch_norm(xt, None, None, sn.tensor(w), sn.tensor(b), training=True)
            out.backward(sn.tensor(gs))
        results.append((out.numpy(), xt.grad.numpy()))
    for a, b_ in zip(*results):
        np.testing.assert_allclose(a, b_, **tol(np.float32))


def test_dispatch_takes_runs_of_more_than_one_position():
    x4, x2 = np.ones((4, 3, 2, 2), np.float32), np.ones((4, 3), np.float32)
    with kernels.use("numba"):
        for step in batchnorm.KERNEL_STEPS:
            assert kernels.lookup("batch_norm", x4, step=step) is not None
            assert kernels.lookup("batch_norm", x2, step=step) is None
            assert kernels.lookup("batch_norm", np.ones((4, 3, 1), np.float32),
                                  step=step) is None
        # mixed dtypes take the xp code (which promotes, as it did before)
        assert batchnorm.batch_kernels(x4, np.ones(3), np.ones(3)) is None
    assert set(dispatch.TABLE["batch_norm"].kernels) == set(batchnorm.KERNEL_STEPS)
    with kernels.use("xp"):
        assert batchnorm.batch_kernels(x4) is None


def test_kernel_wrappers_check_their_arrays():
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(TypeError, match="batch_norm kernels need NumPy float32"):
        norm.batch_moments(x.astype(np.int64))
    with pytest.raises(ValueError, match=r"array of shape \(2,\), expected \(3,\)"):
        norm.batch_normalize(x, np.zeros(2), np.ones(3), 8, 1e-5)
    with pytest.raises(TypeError, match="float64"):  # weight and bias: x's dtype
        norm.batch_normalize(x, np.zeros(3), np.ones(3), 8, 1e-5, np.ones(3), np.ones(3))
    strided = np.ones(6, np.float32)[::2]  # running statistics are updated in place
    with pytest.raises(ValueError, match=r"must be C-contiguous \(3,\) arrays"):
        norm.batch_normalize(x, np.zeros(3), np.ones(3), 8, 1e-5, running=(strided, None))
    with pytest.raises(ValueError, match=r"sums of shape \(3,\), expected \(2, 3\)"):
        norm.batch_input_grad(x, x, np.zeros(3), np.ones(3), None, np.zeros(3), 8)
    with pytest.raises(ValueError, match=r"shapes \(2, 3, 4\) and \(2, 3, 5\)"):
        norm.batch_grad_sums(np.ones((2, 3, 5), np.float32), x, np.zeros(3))
    with pytest.raises(ValueError, match="no values per channel"):
        norm.batch_moments(np.ones((0, 3, 4), np.float32))


def _m2_error(x):
    mean, m2 = norm.batch_moments(x)
    want = ((x - x.mean(axis=(0, 2))[None, :, None]) ** 2).sum(axis=(0, 2))
    return np.abs(m2 / want - 1).max(), np.abs(mean / x.mean(axis=(0, 2)) - 1).max()


def test_an_outlier_first_value_takes_a_second_pass(monkeypatch):
    """One pass shifted by a channel's first value loses digits when that
    value lies far from the mean; the kernel then shifts by the mean."""
    rng = np.random.default_rng(11)
    x = 1e6 + rng.standard_normal((512, 2, 65))
    x[0, 1, 0] += 1e5  # channel 1 starts at a value 1e5 from the rest
    m2_error, mean_error = _m2_error(x)
    assert m2_error < 1e-13 and mean_error < 1e-14
    # the check can fail: with one pass only, the error is 1e4 times larger
    monkeypatch.setattr(batch_norm_kernels, "SHIFT_LIMIT", np.inf)
    assert _m2_error(x)[0] > 1e-12


def test_nan_and_constant_channels():
    x = np.ones((4, 3, 5), np.float32)
    x[:, 1] = np.arange(20, dtype=np.float32).reshape(4, 5)
    x[2, 2, 3] = np.nan
    mean, m2 = norm.batch_moments(x)
    assert mean[0] == 1 and m2[0] == 0  # a constant channel: variance exactly 0
    np.testing.assert_allclose(m2[1], np.var(np.arange(20.0)) * 20, rtol=1e-15)
    assert np.isnan(mean[2]) and np.isnan(m2[2])
    sums = norm.batch_grad_sums(np.ones_like(x), x, mean.astype(np.float32))
    assert np.isnan(sums[1, 2]) and sums[0, 2] == 20 and not np.isnan(sums[:, :2]).any()


def test_empty_batches_give_zero_sums():
    x = np.ones((0, 3, 4), np.float32)
    np.testing.assert_array_equal(norm.batch_grad_sums(x, x, np.zeros(3)), 0)
    assert norm.batch_normalize(x, np.zeros(3), np.ones(3), 1, 1e-5)[0].shape == x.shape


@pytest.mark.parametrize("momentum", [0.0, None, 0.3])
def test_functional_running_statistics_with_kernels(momentum):
    """F.batch_norm: momentum 0 or None leaves the running statistics alone;
    otherwise PyTorch's update, in float64, rounded once to float32."""
    x = _data((4, 3, 5, 5), np.float32, seed=12)[0]
    rm, rv = np.full(3, 0.25, np.float32), np.full(3, 2.0, np.float32)
    running = sn.tensor(rm.copy()), sn.tensor(rv.copy())
    with kernels.use("numba"):
        out = F.batch_norm(sn.tensor(x, requires_grad=True), *running, training=True,
                           momentum=momentum)
    assert out._ctx.kernels is not None
    x64 = x.astype(np.float64)
    m = momentum or 0.0
    want_mean = m * x64.mean(axis=(0, 2, 3)) + (1 - m) * rm.astype(np.float64)
    want_var = m * x64.var(axis=(0, 2, 3), ddof=1) + (1 - m) * rv.astype(np.float64)
    np.testing.assert_array_equal(running[0].numpy(), want_mean.astype(np.float32))
    np.testing.assert_allclose(running[1].numpy(), want_var.astype(np.float32), rtol=1e-7)


@pytest.mark.parametrize("mode", ["numba", "xp"])
def test_eval_backward_uses_the_statistics_of_its_forward(mode):
    """A training step between an eval forward and its backward moves the
    running statistics; the eval graph's gradients stay those of its forward."""
    x, g, w, b = _data((3, 4, 5, 5), np.float64, seed=13)
    bn = nn.BatchNorm2d(4, dtype=np.float64)
    bn.running_mean.data[...], bn.running_var.data[...] = b, w * w
    with kernels.use(mode):
        bn.eval()
        xt = sn.tensor(x, requires_grad=True)
        out = bn(xt)
        bn.train()
        bn(sn.tensor(x * 3.0 + 1.0))  # moves the running statistics
        out.backward(sn.tensor(g))
    scale = (bn.weight.numpy() / np.sqrt(w * w + 1e-5)).reshape(1, -1, 1, 1)
    np.testing.assert_allclose(xt.grad.numpy(), g * scale, rtol=1e-12)
    xhat = (x - b.reshape(1, -1, 1, 1)) / np.sqrt(w * w + 1e-5).reshape(1, -1, 1, 1)
    np.testing.assert_allclose(bn.weight.grad.numpy(), (g * xhat).sum(axis=(0, 2, 3)),
                               rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("block_bytes", [1, 200, 1 << 19])  # a channel, a few, all
def test_fused_backward_is_the_two_kernels_bit_for_bit(monkeypatch, dtype, block_bytes):
    """One call a block of channels at a time (no group: the op's training
    backward) gives the sums, Σ g·x̂ and the input gradient of the two calls."""
    monkeypatch.setattr(batch_norm_kernels, "BLOCK_BYTES", block_bytes)
    for k, shape in enumerate(SHAPES + [(9, 6, 4, 4), (1, 4, 3)]):
        x, g, w, _ = _data(shape, dtype, seed=k, loc=3.0)
        count = x.size // shape[1]
        for weight in (w, None):
            mean, m2 = norm.batch_moments(x)
            rstd = norm.batch_normalize(x, mean, m2, count, 1e-5, weight, weight)[1]
            sums = norm.batch_grad_sums(g, x, mean)
            sums[1] *= rstd
            want = norm.batch_input_grad(g, x, mean, rstd, weight, sums, count)
            got, got_sums = norm.batch_backward(g, x, mean, rstd, weight, count)
            np.testing.assert_array_equal(got_sums, sums)
            np.testing.assert_array_equal(got, want)
            assert got.dtype == np.dtype(dtype)
