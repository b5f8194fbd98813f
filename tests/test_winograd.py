"""Winograd F(2x2, 3x3) (kernels/winograd.py) against the nested-loop
definition and float64 finite differences, against the columns' GEMM path
(``SPMDNET_KERNELS=xp``) in float32, over odd and even sizes, asymmetric
and 'same' paddings, bias or none, one block of images or several with a
short last one; the shape policy (``dispatch.winograd_takes``)."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet.autograd import gradcheck
from spmdnet.kernels import dispatch, winograd, winograd_transforms
from tests.helpers.kernel_calls import count_steps
from tests.helpers.plain_python import PLAIN_PYTHON, run_plain_python_subprocess
from tests.test_conv import conv2d_loops

CASES = [  # (x shape, out channels, padding, loop pads)
    ((2, 3, 6, 6), 4, 1, ((1, 1), (1, 1))),            # even output: whole tiles
    ((3, 2, 5, 7), 3, 1, ((1, 1), (1, 1))),            # odd output rows and columns
    ((1, 4, 7, 5), 2, 0, ((0, 0), (0, 0))),            # no padding
    ((2, 2, 4, 9), 3, (2, 0), ((2, 2), (0, 0))),       # uneven padding
    ((2, 3, 5, 6), 2, "same", ((1, 1), (1, 1))),       # 'same'
    ((1, 2, 3, 3), 1, 1, ((1, 1), (1, 1))),            # one tile
    ((5, 2, 4, 4), 3, 1, ((1, 1), (1, 1))),            # several blocks, a short last one
    ((2, 2, 1, 3), 2, 1, ((1, 1), (1, 1))),            # one input row
]


@pytest.fixture
def winograd_everywhere(monkeypatch):
    """Winograd on every channel count, blocks of 8 tiles at 5 channels in
    and out (several per batch, the last one short), and how many times
    each step ran."""
    monkeypatch.setattr(dispatch, "WINOGRAD_MIN_CHANNELS", 1)
    monkeypatch.setattr(winograd, "BLOCK_VALUES", 40)
    return count_steps(monkeypatch, "conv2d", ("winograd_forward", "winograd_backward"))


@pytest.mark.parametrize("xs,o,padding,pads", CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_winograd_matches_loops_and_finite_differences(float64, winograd_everywhere, xs, o,
                                                       padding, pads, bias):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs), rng.standard_normal((o, xs[1], 3, 3))
    b = rng.standard_normal(o) if bias else None
    want = conv2d_loops(x, w, b, (1, 1), pads, (1, 1), 1)
    with sn.kernels.use("numba"):
        got = F.conv2d(sn.tensor(x), sn.tensor(w), None if b is None else sn.tensor(b),
                       padding=padding)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
        args = (x, w, b) if bias else (x, w)
        assert gradcheck(lambda x, w, b=None: F.conv2d(x, w, b, padding=padding), *args)
    assert winograd_everywhere["winograd_forward"] > 0
    assert winograd_everywhere["winograd_backward"] > 0


@pytest.mark.parametrize("xs,o,padding,pads", CASES)
def test_winograd_float32_equals_gemm_path(winograd_everywhere, xs, o, padding, pads):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((o, xs[1], 3, 3)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    g, results = None, []
    for mode in ("numba", "xp"):
        with sn.kernels.use(mode):
            ts = [sn.tensor(a, requires_grad=True) for a in (x, w, b)]
            out = F.conv2d(*ts, padding=padding)
            if g is None:
                g = rng.standard_normal(out.shape).astype(np.float32)
            (out * sn.tensor(g)).sum().backward()
            assert out.dtype == np.float32 and ts[0].grad.dtype == np.float32
            results.append([out.numpy()] + [t.grad.numpy() for t in ts])
    assert winograd_everywhere == {"winograd_forward": 1, "winograd_backward": 1}
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_resnet_layer_float32_close_to_float64():
    """A ResNet-18 stage-one layer at its real size (16 channels, the
    default policy and blocks): float32 Winograd within float32 rounding of
    the float64 result."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 16, 12, 12))
    w = rng.standard_normal((16, 16, 3, 3)) / 12
    g = rng.standard_normal((3, 16, 12, 12))
    assert dispatch.winograd_takes(w.shape, (1, 1), (1, 1), 1)
    results = []
    for dtype in (np.float32, np.float64):
        with sn.kernels.use("numba" if dtype == np.float32 else "xp"):
            xt, wt = (sn.tensor(a.astype(dtype), requires_grad=True) for a in (x, w))
            out = F.conv2d(xt, wt, padding=1)
            (out * sn.tensor(g.astype(dtype))).sum().backward()
            results.append([out.numpy(), xt.grad.numpy(), wt.grad.numpy()])
    for got, want in zip(*results):
        scale = np.abs(want).max()
        assert np.abs(got - want).max() <= 2e-6 * scale


@pytest.mark.parametrize("copy_min_tiles", [0, 10**9])
def test_forward_with_u_transposed_copied_or_viewed(monkeypatch, copy_min_tiles):
    """The forward's GEMMs on Uᵀ copied contiguous (from
    ``winograd.UT_COPY_MIN_TILES`` tiles) or on its transposed view, over
    several blocks with a short last one: the definition's numbers both ways."""
    monkeypatch.setattr(winograd, "UT_COPY_MIN_TILES", copy_min_tiles)
    monkeypatch.setattr(winograd, "BLOCK_VALUES", 40)
    rng = np.random.default_rng(7)
    x, w, b = (rng.standard_normal(s) for s in ((5, 3, 5, 6), (4, 3, 3, 3), (4,)))
    pads = ((1, 1), (1, 1))
    got, _ = winograd.forward(x, w, b, pads, (5, 6))
    np.testing.assert_allclose(got, conv2d_loops(x, w, b, (1, 1), pads, (1, 1), 1),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("xs,o,padding,by_rows", [
    ((2, 32, 5, 6), 33, 1, False), ((3, 40, 4, 3), 32, (2, 0), False),
    ((2, 16, 5, 17), 17, 1, True), ((1, 17, 4, 18), 16, (0, 2), True)])
def test_wide_layers_match_loops_and_the_gemm_path(float64, xs, o, padding, by_rows):
    """Both transposes between NCHW and the channels-last rows (a pixel at a
    time below ``winograd_transforms.ROWS_MIN_WIDTH``, a channel's image row
    at a time from it; odd and even widths, left pads 0 to 2): the forward
    against the definition, the gradients against the columns' GEMM path in
    float64, under the default policy and blocks."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(xs), rng.standard_normal((o, xs[1], 3, 3))
    pads = ((padding, padding), (padding, padding)) if isinstance(padding, int) else \
        ((padding[0], padding[0]), (padding[1], padding[1]))
    assert (xs[3] >= winograd_transforms.ROWS_MIN_WIDTH) == by_rows
    assert dispatch.winograd_takes(w.shape, (1, 1), (1, 1), 1)
    results = []
    for mode in ("numba", "xp"):
        with sn.kernels.use(mode):
            xt, wt = sn.tensor(x, requires_grad=True), sn.tensor(w, requires_grad=True)
            out = F.conv2d(xt, wt, padding=padding)
            if mode == "numba":
                np.testing.assert_allclose(out.numpy(), conv2d_loops(x, w, None, (1, 1), pads,
                                                                     (1, 1), 1),
                                           rtol=1e-11, atol=1e-11)
                g = rng.standard_normal(out.shape)
            (out * sn.tensor(g)).sum().backward()
            results.append([out.numpy(), xt.grad.numpy(), wt.grad.numpy()])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


# (where, image, channel, row, column, value): corners, edges and a later image
NONFINITE_CASES = [("input", 0, 1, 2, 2, np.inf), ("input", 1, 0, 0, 0, -np.inf),
                   ("input", 1, 2, 5, 5, np.nan), ("input", 0, 2, 5, 0, np.inf),
                   ("output gradient", 1, 2, 3, 3, -np.inf),
                   ("output gradient", 0, 0, 0, 0, np.nan),
                   ("output gradient", 1, 3, 5, 5, np.inf),
                   ("output gradient", 1, 1, 0, 5, -np.inf)]


@pytest.mark.parametrize("where,n,c,r,s,value", NONFINITE_CASES)
def test_inf_gives_the_direct_sums_inf_not_nan(winograd_everywhere, where, n, c, r, s, value):
    """Winograd's transforms subtract inputs, so an inf would give NaN (inf -
    inf) where the direct sum (PyTorch's) gives inf: the input transform
    finds an inf or NaN in the input and the forward goes to the columns'
    GEMM, the gradient transform one in the output gradient and the backward
    does; inf and NaN then sit exactly where the GEMM path puts them."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    w = np.abs(rng.standard_normal((4, 3, 3, 3))).astype(np.float32)
    g = np.ones((2, 4, 6, 6), np.float32)
    (x if where == "input" else g)[n, c, r, s] = value
    results = []
    for mode in ("numba", "xp"):
        with sn.kernels.use(mode), np.errstate(invalid="ignore"):
            xt, wt = sn.tensor(x, requires_grad=True), sn.tensor(w, requires_grad=True)
            out = F.conv2d(xt, wt, padding=1)
            out.backward(sn.tensor(g))
            results.append([out.numpy(), xt.grad.numpy(), wt.grad.numpy()])
    if not np.isnan(value):  # the case is real
        assert np.isinf(results[1][0 if where == "input" else 1]).any()
    for got, want in zip(*results):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    # the kernel was asked and handed the step back (the backward, after the
    # columns' forward, is the columns' too)
    assert winograd_everywhere == {"winograd_forward": 1,
                                   "winograd_backward": 0 if where == "input" else 1}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_block_is_probed(dtype):
    """A NaN in the last block of images (several blocks) or in the last row
    and column of a wide layer still sends the call back."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((20, 16, 16, 16)).astype(dtype)
    w = rng.standard_normal((16, 16, 3, 3)).astype(dtype)
    pads = ((1, 1), (1, 1))
    assert len(winograd._Blocks(x.shape, 16, (16, 16), x.dtype, pads).ranges) > 1
    out, saved = winograd.forward(x, w, None, pads, (16, 16))
    g = np.ones_like(out)
    assert winograd.backward(g, saved, w, pads) is not None
    for where in ((19, 15, 15, 15), (19, 0, 0, 0), (17, 3, 4, 2), (0, 8, 15, 0)):
        bad = x.copy()
        bad[where] = np.nan
        assert winograd.forward(bad, w, None, pads, (16, 16)) is None
        bad_g = g.copy()
        bad_g[where] = np.inf
        assert winograd.backward(bad_g, saved, w, pads) is None
        assert winograd.backward(bad_g, saved, w, pads, need_weight=False) is None


def test_only_one_gradient_asked(winograd_everywhere):
    """An input that needs no gradient gets none computed, and a frozen
    weight likewise; the other gradient is still the GEMM path's."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 5))
    w = rng.standard_normal((2, 3, 3, 3))
    g = rng.standard_normal((2, 2, 5, 5))
    with sn.kernels.use("xp"):
        xr, wr = sn.tensor(x, requires_grad=True), sn.tensor(w, requires_grad=True)
        (F.conv2d(xr, wr, padding=1) * sn.tensor(g)).sum().backward()
    with sn.kernels.use("numba"):
        for x_grad in (True, False):
            xt = sn.tensor(x, requires_grad=x_grad)
            wt = sn.tensor(w, requires_grad=not x_grad)
            (F.conv2d(xt, wt, padding=1) * sn.tensor(g)).sum().backward()
            asked, other = (xt, wt) if x_grad else (wt, xt)
            want = xr.grad if x_grad else wr.grad
            np.testing.assert_allclose(asked.grad.numpy(), want.numpy(), rtol=1e-12,
                                       atol=1e-12)
            assert other.grad is None
    assert winograd_everywhere == {"winograd_forward": 2, "winograd_backward": 2}


def test_winograd_policy():
    """Stride-1 undilated ungrouped 3x3 with enough channels both ways;
    nothing else."""
    takes = dispatch.winograd_takes
    assert takes((16, 16, 3, 3), (1, 1), (1, 1), 1)
    assert takes((128, 64, 3, 3), (1, 1), (1, 1), 1)
    assert not takes((16, 3, 3, 3), (1, 1), (1, 1), 1)      # the stem
    assert not takes((8, 16, 3, 3), (1, 1), (1, 1), 1)      # few outputs
    assert not takes((16, 16, 3, 3), (2, 2), (1, 1), 1)     # strided
    assert not takes((16, 16, 3, 3), (1, 1), (2, 2), 1)     # dilated
    assert not takes((32, 16, 3, 3), (1, 1), (1, 1), 2)     # grouped
    assert not takes((16, 16, 5, 5), (1, 1), (1, 1), 1)     # 5x5
    assert not takes((16, 16, 3, 1), (1, 1), (1, 1), 1)


def test_xp_mode_takes_no_winograd(winograd_everywhere):
    x = sn.tensor(np.ones((1, 2, 4, 4), np.float32), requires_grad=True)
    with sn.kernels.use("xp"):
        F.conv2d(x, sn.ones(2, 2, 3, 3), padding=1).sum().backward()
    assert winograd_everywhere == {"winograd_forward": 0, "winograd_backward": 0}


def test_transformed_weight_is_g_w_gt():
    """U[4k + l, o, c] = (G w[o, c] Gᵀ)[k, l] for every (o, c), and the
    weight gradient's fold is its adjoint, Gᵀ dU G, overwriting or adding."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((3, 2, 3, 3))
    u = winograd.transformed_weight(w)
    du = rng.standard_normal((16, 3, 2))
    gw = np.full((3, 2 * 9), 7.0)
    winograd_transforms.weight_grad(du.reshape(16, 6), gw, False)
    twice = gw.copy()
    winograd_transforms.weight_grad(du.reshape(16, 6), twice, True)
    for o in range(3):
        for c in range(2):
            np.testing.assert_allclose(u[:, o, c].reshape(4, 4),
                                       winograd.G @ w[o, c] @ winograd.G.T, atol=1e-14)
            want = winograd.G.T @ du[:, o, c].reshape(4, 4) @ winograd.G
            np.testing.assert_allclose(gw[o, 9 * c:9 * c + 9].reshape(3, 3), want, atol=1e-14)
            np.testing.assert_allclose(twice[o, 9 * c:9 * c + 9].reshape(3, 3), 2 * want,
                                       atol=1e-14)


@pytest.mark.skipif(PLAIN_PYTHON, reason="this is that subprocess")
def test_winograd_kernels_as_plain_python():
    """The kernel bodies as plain Python give the GEMM path's numbers too."""
    run_plain_python_subprocess(__file__, "float32_equals_gemm")


@pytest.mark.parametrize("where", ["input", "output gradient"])
def test_finite_values_whose_transform_sums_overflow_take_the_columns(winograd_everywhere,
                                                                      where):
    """Finite float32 values near the top of the range: the transforms' sums
    (d1 + d2, then two columns) would overflow to inf and then give NaN
    (inf - inf), where the direct sum stays finite. The probe sends such
    values to the columns' GEMM too, so the result is the xp path's."""
    x = np.zeros((1, 16, 4, 4), np.float32)
    w = np.full((16, 16, 3, 3), 1e-3, np.float32)
    g = np.ones((1, 16, 4, 4), np.float32)
    if where == "input":
        x[0, 0, 1, :] = x[0, 0, 2, :] = 2e38
    else:
        x[...] = 1
        g[0, 0, 0, :] = g[0, 0, 1, :] = 2e38
    results = []
    for mode in ("numba", "xp"):
        with sn.kernels.use(mode), np.errstate(invalid="ignore", over="ignore"):
            xt, wt = sn.tensor(x, requires_grad=True), sn.tensor(w, requires_grad=True)
            out = F.conv2d(xt, wt, padding=1)
            out.backward(sn.tensor(g))
            results.append([out.numpy(), xt.grad.numpy(), wt.grad.numpy()])
    assert np.isfinite(results[1][0 if where == "input" else 1]).all()  # the case is real
    for got, want in zip(*results):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5)
    assert winograd_everywhere == {"winograd_forward": 1,
                                   "winograd_backward": 0 if where == "input" else 1}
