"""Pooling against float64 finite differences and plain nested-loop
references (PyTorch's windows, ceil_mode, count_include_pad, ties), the
modules, and the max-pool kernel against the xp code (compiled, and as
plain Python in a subprocess)."""
import math

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import nn
from spmdnet.autograd import gradcheck
from spmdnet.kernels import pool as pool_kernels
from spmdnet.ops.pooling import pool_out_size
from tests.helpers.plain_python import PLAIN_PYTHON, run_plain_python_subprocess


def pool_loops(x, k, s, p, d, ceil_mode, kind, count_include_pad=True):
    """(values, flat argmax indices) by the definition (max: the first maximum
    in row-major window order; avg: PyTorch's divisor)."""
    n, c, h, w = x.shape
    ho, wo = (pool_out_size(sz, k[i], s[i], p[i], d[i], ceil_mode) for i, sz in
              enumerate((h, w)))
    out, idx = np.zeros((n, c, ho, wo)), np.zeros((n, c, ho, wo), np.int64)
    for a in range(n):
        for b in range(c):
            for i in range(ho):
                for j in range(wo):
                    best, at, total, count = -np.inf, -1, 0.0, 0
                    for u in range(k[0]):
                        for v in range(k[1]):
                            r, q = i * s[0] - p[0] + u * d[0], j * s[1] - p[1] + v * d[1]
                            if 0 <= r < h and 0 <= q < w:
                                total += x[a, b, r, q]
                                count += 1
                                if at < 0 or x[a, b, r, q] > best:
                                    best, at = x[a, b, r, q], r * w + q
                    if kind == "max":
                        out[a, b, i, j], idx[a, b, i, j] = best, at
                    else:
                        h0, w0 = i * s[0] - p[0], j * s[1] - p[1]
                        h1, w1 = min(h0 + k[0], h + p[0]), min(w0 + k[1], w + p[1])
                        div = (h1 - h0) * (w1 - w0) if count_include_pad else count
                        out[a, b, i, j] = total / div
    return out, idx


CASES = [  # kernel, stride, padding, dilation, ceil_mode, shape
    ((2, 2), (2, 2), (0, 0), (1, 1), False, (2, 3, 6, 6)),
    ((3, 3), (2, 2), (1, 1), (1, 1), True, (1, 2, 7, 6)),
    ((3, 2), (1, 2), (1, 0), (2, 1), False, (2, 1, 7, 5)),
    ((2, 3), (3, 2), (1, 1), (1, 1), True, (1, 2, 8, 7)),
    ((3, 3), (3, 3), (0, 0), (1, 1), True, (1, 1, 7, 8)),
]


@pytest.mark.parametrize("k,s,p,d,ceil_mode,shape", CASES)
def test_max_pool2d_matches_loops_and_finite_differences(k, s, p, d, ceil_mode, shape):
    x = np.random.default_rng(0).standard_normal(shape)
    want, want_idx = pool_loops(x, k, s, p, d, ceil_mode, "max")
    for mode in ("numba", "xp"):
        with sn.kernels.use(mode):
            got, idx = F.max_pool2d(sn.tensor(x), k, s, p, d, ceil_mode, return_indices=True)
            np.testing.assert_array_equal(got.numpy(), want)
            np.testing.assert_array_equal(idx.numpy(), want_idx)
            assert gradcheck(lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode), x)


@pytest.mark.parametrize("k,s,p,d,ceil_mode,shape", CASES)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d_matches_loops_and_finite_differences(k, s, p, d, ceil_mode, shape,
                                                         count_include_pad):
    x = np.random.default_rng(1).standard_normal(shape)
    want, _ = pool_loops(x, k, s, p, (1, 1), ceil_mode, "avg", count_include_pad)
    got = F.avg_pool2d(sn.tensor(x), k, s, p, ceil_mode, count_include_pad)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    assert gradcheck(lambda x: F.avg_pool2d(x, k, s, p, ceil_mode, count_include_pad), x)


def test_avg_pool2d_divisor_override():
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    got = F.avg_pool2d(sn.tensor(x), 2, divisor_override=3).numpy()
    np.testing.assert_allclose(got, x.reshape(1, 1, 2, 2, 2, 2).sum(axis=(3, 5)) / 3)


@pytest.mark.parametrize("mode", ["numba", "xp"])
def test_max_pool2d_ties_send_the_gradient_to_the_first_maximum(mode):
    """As PyTorch: one element per window gets the gradient, the first maximum
    in the window's row-major order; overlapping windows add up."""
    x = np.array([[[[1.0, 3.0, 3.0, 0.0],
                    [3.0, 2.0, 3.0, 3.0],
                    [0.0, 0.0, 5.0, 5.0],
                    [0.0, 0.0, 5.0, 5.0]]]], np.float32)
    with sn.kernels.use(mode):
        xt = sn.tensor(x, requires_grad=True)
        y, idx = F.max_pool2d(xt, 2, return_indices=True)
        y.sum().backward()
        np.testing.assert_array_equal(idx.numpy()[0, 0], [[1, 2], [8, 10]])
        np.testing.assert_array_equal(xt.grad.numpy()[0, 0], [[0, 1, 1, 0], [0, 0, 0, 0],
                                                              [1, 0, 1, 0], [0, 0, 0, 0]])
        xt = sn.tensor(x, requires_grad=True)
        F.max_pool2d(xt, 2, stride=1).sum().backward()  # overlapping windows
        np.testing.assert_array_equal(xt.grad.numpy()[0, 0], [[0, 2, 1, 0], [1, 0, 0, 0],
                                                              [1, 0, 4, 0], [0, 0, 0, 0]])


def adaptive_loops(x, out, kind):
    n, c, h, w = x.shape
    res = np.zeros((n, c) + out)
    for i in range(out[0]):
        for j in range(out[1]):
            h0, h1 = i * h // out[0], math.ceil((i + 1) * h / out[0])
            w0, w1 = j * w // out[1], math.ceil((j + 1) * w / out[1])
            win = x[:, :, h0:h1, w0:w1]
            res[:, :, i, j] = win.max(axis=(2, 3)) if kind == "max" else win.mean(axis=(2, 3))
    return res


@pytest.mark.parametrize("out", [(1, 1), (3, 2), (5, 7), (4, 4)])
def test_adaptive_pools_match_loops_and_finite_differences(out):
    x = np.random.default_rng(2).standard_normal((2, 3, 5, 7))
    np.testing.assert_allclose(F.adaptive_avg_pool2d(sn.tensor(x), out).numpy(),
                               adaptive_loops(x, out, "avg"), rtol=1e-12)
    np.testing.assert_array_equal(F.adaptive_max_pool2d(sn.tensor(x), out).numpy(),
                                  adaptive_loops(x, out, "max"))
    assert gradcheck(lambda x: F.adaptive_avg_pool2d(x, out), x)
    assert gradcheck(lambda x: F.adaptive_max_pool2d(x, out), x)
    assert F.adaptive_avg_pool2d(sn.tensor(x), (None, 2)).shape == (2, 3, 5, 2)


def test_interpolate_nearest():
    x = np.arange(6.0).reshape(1, 1, 2, 3)
    got = F.interpolate(sn.tensor(x), scale_factor=2).numpy()
    np.testing.assert_array_equal(got, x.repeat(2, axis=2).repeat(2, axis=3))
    got = F.interpolate(sn.tensor(x), size=(3, 2)).numpy()[0, 0]  # floor(i · in / out)
    np.testing.assert_array_equal(got, [[0, 1], [0, 1], [3, 4]])
    assert gradcheck(lambda x: F.interpolate(x, size=(5, 4)), x)
    with pytest.raises(NotImplementedError):
        F.interpolate(sn.tensor(x), size=4, mode="bilinear")


def test_pooling_modules_and_errors():
    x = sn.randn(2, 3, 8, 8)
    assert nn.MaxPool2d(2)(x).shape == (2, 3, 4, 4)
    assert nn.MaxPool2d(3, 2, 1, ceil_mode=True)(x).shape == (2, 3, 5, 5)
    values, idx = nn.MaxPool2d(2, return_indices=True)(x)
    assert idx.dtype == np.int64 and values.shape == idx.shape
    assert nn.AvgPool2d(2, 1)(x).shape == (2, 3, 7, 7)
    assert nn.AdaptiveAvgPool2d(1)(x).shape == (2, 3, 1, 1)
    assert nn.AdaptiveMaxPool2d((2, 3))(x).shape == (2, 3, 2, 3)
    assert nn.MaxPool2d(2)(sn.randn(3, 8, 8)).shape == (3, 4, 4)  # unbatched
    assert nn.MaxPool2d(2).state_dict() == {}
    with pytest.raises(RuntimeError, match="half"):
        F.max_pool2d(x, 2, padding=2)


# -- the kernel against the xp code -------------------------------------------------------
# CASES[0] and the odd-sized 2x2 case take the kernel's 2x2 stride-2 loop (its
# last row and column dropped), ceil_mode's overhanging 2x2 windows the general one
KERNEL_CASES = CASES[:4] + [((2, 2), (2, 2), (0, 0), (1, 1), False, (2, 3, 7, 9)),
                            ((2, 2), (2, 2), (0, 0), (1, 1), True, (1, 2, 7, 5))]


@pytest.mark.parametrize("k,s,p,d,ceil_mode,shape", KERNEL_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_kernel_matches_xp(k, s, p, d, ceil_mode, shape, dtype):
    x = np.random.default_rng(3).standard_normal(shape).astype(dtype)
    x[0, 0, 1, :] = x[0, 0, 0, 0]  # ties
    x[0, -1, 2:4, 0:4] = 1.5  # ties between a window's rows
    x[-1, -1, 2, 2] = np.nan
    out = tuple(pool_out_size(sz, k[i], s[i], p[i], d[i], ceil_mode)
                for i, sz in enumerate(shape[2:]))
    values, idx = pool_kernels.max_pool_forward(x, k, s, p, d, out)
    with sn.kernels.use("xp"):
        want, want_idx = F.max_pool2d(sn.tensor(x), k, s, p, d, ceil_mode, True)
    np.testing.assert_array_equal(values, want.numpy())
    np.testing.assert_array_equal(idx, want_idx.numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_kernel_2x2_nan_is_the_maximum(dtype):
    """A NaN anywhere in a 2x2 window is its maximum, the first NaN of two
    (PyTorch's rule; the kernel's NaN-free loop must not take these planes)."""
    x = np.array([[1.0, 9.0, 1.0, 9.0, 1.0, 1.0, 1.0, 9.0],
                  [0.0, 0.0, 0.0, 0.0, 9.0, 0.0, 0.0, 0.0],
                  [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                  [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], dtype)
    nan = np.nan
    x[0, 1], x[1, 2], x[1, 5], x[1, 6], x[1, 7] = nan, nan, nan, nan, nan
    x[2, 0] = 7.0
    values, idx = pool_kernels.max_pool_forward(x[None, None], (2, 2), (2, 2), (0, 0),
                                                (1, 1), (2, 4))
    np.testing.assert_array_equal(idx[0, 0], [[1, 10, 13, 14], [16, 18, 20, 22]])
    np.testing.assert_array_equal(values[0, 0], [[nan, nan, nan, nan], [7, 0, 0, 0]])
    clean = np.ones((1, 2, 4, 8), dtype)  # the plane without NaN keeps the fast loop
    clean[0, 1] = x
    values, idx = pool_kernels.max_pool_forward(clean, (2, 2), (2, 2), (0, 0), (1, 1), (2, 4))
    np.testing.assert_array_equal(idx[0, 0], [[0, 2, 4, 6], [16, 18, 20, 22]])
    np.testing.assert_array_equal(idx[0, 1], [[1, 10, 13, 14], [16, 18, 20, 22]])


@pytest.mark.skipif(PLAIN_PYTHON, reason="this is that subprocess")
def test_kernel_as_plain_python():
    run_plain_python_subprocess(__file__, "kernel_matches")
