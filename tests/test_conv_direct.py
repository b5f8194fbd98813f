"""The direct stride-1 convolution kernels (kernels/conv_direct.py) against
the nested-loop definition and float64 finite differences, and against the
GEMM path (``SPMDNET_KERNELS=xp``) in float32, on the shapes dispatch sends
them (few input channels per group: paddings, dilations, groups, depthwise,
odd and even kernels); the shape policy itself."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet.autograd import gradcheck
from spmdnet.kernels import dispatch
from tests.helpers.kernel_calls import count_steps
from tests.helpers.plain_python import PLAIN_PYTHON, run_plain_python_subprocess
from tests.test_conv import conv2d_loops

CASES = [  # (x shape, w shape, padding, dilation, groups, loop pads)
    ((2, 3, 9, 8), (4, 3, 5, 5), 0, 1, 1, ((0, 0), (0, 0))),                # CIFAR conv1
    ((1, 3, 11, 10), (2, 3, 5, 5), (2, 1), (2, 1), 1, ((2, 2), (1, 1))),    # dilation
    ((2, 2, 9, 13), (3, 2, 5, 5), 1, (1, 2), 1, ((1, 1), (1, 1))),          # along rows
    ((2, 6, 8, 9), (4, 3, 5, 5), "same", 1, 2, ((2, 2), (2, 2))),           # groups
    ((2, 4, 7, 6), (8, 1, 3, 3), 1, 2, 4, ((1, 1), (1, 1))),                # depthwise x2
    ((1, 1, 6, 7), (2, 1, 2, 4), "same", 1, 1, ((0, 1), (1, 2))),           # even kernel
    ((3, 1, 5, 7), (2, 1, 3, 3), (1, 0), (1, 2), 1, ((1, 1), (0, 0))),      # one channel
    ((1, 2, 4, 4), (4, 1, 1, 1), 0, 1, 2, ((0, 0), (0, 0))),                # 1x1, grouped
    ((2, 6, 9, 8), (5, 6, 5, 5), 0, 1, 1, ((0, 0), (0, 0))),                # CIFAR conv2
    ((2, 3, 8, 7), (3, 3, 3, 3), 1, 1, 1, ((1, 1), (1, 1))),                # ResNet stem
    ((1, 4, 7, 9), (6, 2, 3, 4), 1, 1, 2, ((1, 1), (1, 1))),                # odd per group
    ((2, 3, 7, 6), (9, 3, 3, 3), 1, 1, 1, ((1, 1), (1, 1))),                # 4 + 4 + 1 outputs
    ((1, 2, 5, 6), (5, 2, 3, 3), 3, 1, 1, ((3, 3), (3, 3))),                # pad past k - 1
    ((2, 8, 7, 9), (8, 8, 3, 3), 1, 1, 1, ((1, 1), (1, 1))),                # ResNet width 8
    ((1, 15, 6, 5), (7, 15, 3, 3), 0, 1, 1, ((0, 0), (0, 0))),              # the bound
    ((2, 6, 9, 8), (10, 6, 5, 5), 0, 1, 1, ((0, 0), (0, 0))),               # input grad: GEMM
]


def _direct_input(ws, pads, dilation, groups):
    """Whether dispatch gives this case the direct input gradient."""
    dilation = (dilation, dilation) if isinstance(dilation, int) else dilation
    return dispatch.conv_direct_input_takes(ws, pads, dilation, groups)


@pytest.fixture
def direct_calls(monkeypatch):
    """How many times conv2d ran the direct forward and gradient kernels."""
    return count_steps(monkeypatch, "conv2d", ("direct_forward", "direct_weight_grad",
                                               "direct_input_grad"))


@pytest.mark.parametrize("xs,ws,padding,dilation,groups,pads", CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_direct_matches_loops_and_finite_differences(float64, direct_calls, xs, ws, padding,
                                                     dilation, groups, pads, bias):
    assert dispatch.conv_direct_takes(ws, (1, 1))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    b = rng.standard_normal(ws[0]) if bias else None
    pair = (lambda v: (v, v) if isinstance(v, int) else v)
    want = conv2d_loops(x, w, b, (1, 1), pads, pair(dilation), groups)
    with sn.kernels.use("numba"):
        got = F.conv2d(sn.tensor(x), sn.tensor(w), None if b is None else sn.tensor(b), 1,
                       padding, dilation, groups)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
        args = (x, w, b) if bias else (x, w)
        assert gradcheck(lambda x, w, b=None: F.conv2d(x, w, b, 1, padding, dilation, groups),
                         *args)
    assert direct_calls["direct_forward"] > 0 and direct_calls["direct_weight_grad"] > 0
    assert (direct_calls["direct_input_grad"] > 0) == _direct_input(ws, pads, dilation, groups)


@pytest.mark.parametrize("xs,ws,padding,dilation,groups,pads", CASES)
def test_direct_float32_equals_gemm_path(direct_calls, xs, ws, padding, dilation, groups,
                                         pads):
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws, ws[:1]))
    g = None
    results = []
    for mode in ("numba", "xp"):
        with sn.kernels.use(mode):
            ts = [sn.tensor(a, requires_grad=True) for a in (x, w, b)]
            out = F.conv2d(*ts, 1, padding, dilation, groups)
            if g is None:
                g = rng.standard_normal(out.shape).astype(np.float32)
            (out * sn.tensor(g)).sum().backward()
            assert out.dtype == np.float32 and ts[1].grad.dtype == np.float32
            results.append([out.numpy()] + [t.grad.numpy() for t in ts])
        if mode == "numba":  # the direct path ran, then the GEMM path alone
            assert direct_calls["direct_forward"] == 1
            assert direct_calls["direct_weight_grad"] == 1
            assert direct_calls["direct_input_grad"] == _direct_input(ws, pads, dilation,
                                                                      groups)
    assert direct_calls["direct_forward"] == 1
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("ws,groups", [((4, 3, 5, 5), 1), ((6, 2, 3, 3), 2)])
def test_direct_weight_grad_with_inf_and_nan_matches_gemm_path(direct_calls, ws, groups):
    """An inf in an input column that the widened rows' zero columns reach,
    and a NaN: the same inf, NaN and finite entries as the GEMM path (the
    kernel's row-by-row dot products; widened rows would give 0·inf = NaN)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, ws[1] * groups, 9, 8)).astype(np.float32)
    x[0, 1, 4, 7] = np.inf
    x[1, 0, 0, 0] = np.nan
    w = rng.standard_normal(ws).astype(np.float32)
    results = []
    for mode in ("numba", "xp"):
        with sn.kernels.use(mode), np.errstate(invalid="ignore"):  # inf - inf in sums
            wt = sn.tensor(w, requires_grad=True)
            F.conv2d(sn.tensor(x), wt, groups=groups).sum().backward()
            results.append(wt.grad.numpy())
    got, want = results
    assert direct_calls["direct_weight_grad"] == 1
    assert np.isnan(want).any() and np.isinf(want).any() and np.isfinite(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5, atol=2e-5)


def test_direct_not_taken_elsewhere(direct_calls):
    """The GEMM path for strides, more than 15 channels per group, and fewer
    than 9 taps on several channels (the measured shapes: CIFAR's conv1 and
    conv2, ResNet's 3x3 stem, its 8-channel layers)."""
    assert dispatch.conv_direct_takes((16, 6, 5, 5), (1, 1))
    assert dispatch.conv_direct_takes((16, 3, 3, 3), (1, 1))
    assert dispatch.conv_direct_takes((8, 8, 3, 3), (1, 1))
    assert dispatch.conv_direct_takes((16, 15, 3, 3), (1, 1))
    assert not dispatch.conv_direct_takes((4, 3, 5, 5), (2, 1))
    assert not dispatch.conv_direct_takes((32, 16, 5, 5), (1, 1))
    assert not dispatch.conv_direct_takes((16, 3, 2, 2), (1, 1))
    x = sn.tensor(np.ones((1, 3, 9, 9), np.float32), requires_grad=True)
    F.conv2d(x, sn.ones(2, 3, 5, 5), stride=2).sum().backward()
    F.conv2d(x, sn.ones(2, 3, 2, 2), padding=1).sum().backward()
    assert direct_calls == {"direct_forward": 0, "direct_weight_grad": 0, "direct_input_grad": 0}
    with sn.kernels.use("numba"):  # the row's first kernel runs on the direct shape
        F.conv2d(x, sn.ones(2, 3, 5, 5)).sum().backward()  # no weight gradient asked
        assert direct_calls == {"direct_forward": 1, "direct_weight_grad": 0,
                                "direct_input_grad": 1}
        F.conv2d(x.detach(), sn.ones(2, 3, 5, 5, requires_grad=True)).sum().backward()
    assert direct_calls == {"direct_forward": 2, "direct_weight_grad": 1, "direct_input_grad": 1}


@pytest.mark.skipif(PLAIN_PYTHON, reason="this is that subprocess")
def test_direct_kernels_as_plain_python():
    """The kernel bodies as plain Python give the GEMM path's numbers too."""
    run_plain_python_subprocess(__file__, "float32_equals_gemm")
