"""conv2d / conv1d against float64 finite differences and a plain nested-loop
reference; nn.Conv1d/Conv2d init and state_dict; the col2im kernel
against the xp code (compiled, and as plain Python in a subprocess)."""
import math

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import nn
from spmdnet.autograd import gradcheck
from spmdnet.kernels import conv as conv_kernels
from spmdnet.ops.conv import col2im, padded_windows
from spmdnet.ops.conv_columns import col2im_columns, columns
from tests.helpers.plain_python import PLAIN_PYTHON, run_plain_python_subprocess


def conv2d_loops(x, w, b, stride, pads, dilation, groups):
    """The definition, one output element at a time (pads ((t, b), (l, r)))."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    (pt, pb), (pl, pr) = pads
    ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, ho, wo))
    og = o // groups
    for b_ in range(n):
        for oc in range(o):
            g = oc // og
            for i in range(ho):
                for j in range(wo):
                    acc = 0.0 if b is None else b[oc]
                    for ci in range(cg):
                        for u in range(kh):
                            for v in range(kw):
                                r, s = i * sh - pt + u * dh, j * sw - pl + v * dw
                                if 0 <= r < h and 0 <= s < wd:
                                    acc += w[oc, ci, u, v] * x[b_, g * cg + ci, r, s]
                    out[b_, oc, i, j] = acc
    return out


CASES = [  # (x shape, w shape, stride, padding, dilation, groups, loop pads)
    ((2, 3, 7, 6), (4, 3, 3, 3), 1, 0, 1, 1, ((0, 0), (0, 0))),
    ((1, 2, 8, 7), (3, 2, 3, 2), (2, 1), (1, 2), 1, 1, ((1, 1), (2, 2))),
    ((2, 4, 9, 9), (6, 2, 3, 3), 2, 1, (2, 1), 2, ((1, 1), (1, 1))),
    ((1, 3, 5, 6), (3, 1, 3, 3), 1, "same", 1, 3, ((1, 1), (1, 1))),        # depthwise
    ((1, 2, 6, 7), (2, 2, 2, 4), 1, "same", (2, 1), 1, ((1, 1), (1, 2))),   # asymmetric
    ((2, 2, 5, 5), (3, 2, 5, 5), 1, "valid", 1, 1, ((0, 0), (0, 0))),
    ((1, 1, 4, 4), (1, 1, 1, 1), 3, 0, 1, 1, ((0, 0), (0, 0))),
    ((2, 5, 7, 8), (3, 5, 1, 1), (2, 3), 0, 1, 1, ((0, 0), (0, 0))),      # 1x1: pointwise
    ((2, 4, 5, 5), (6, 4, 1, 1), 1, 0, 1, 1, ((0, 0), (0, 0))),           # 1x1, stride 1
    ((1, 4, 5, 5), (6, 4, 1, 1), 2, 1, 1, 1, ((1, 1), (1, 1))),           # 1x1 padded: GEMM
]


@pytest.mark.parametrize("xs,ws,stride,padding,dilation,groups,pads", CASES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mode", ["numba", "xp"])  # the col2im kernel, its xp reference
def test_conv2d_matches_loops_and_finite_differences(xs, ws, stride, padding, dilation, groups,
                                                     pads, bias, mode):
    with sn.kernels.use(mode):
        _check_conv2d(xs, ws, stride, padding, dilation, groups, pads, bias)


def _check_conv2d(xs, ws, stride, padding, dilation, groups, pads, bias):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    b = rng.standard_normal(ws[0]) if bias else None
    pair = (lambda v: (v, v) if isinstance(v, int) else v)
    want = conv2d_loops(x, w, b, pair(stride), pads, pair(dilation), groups)
    got = F.conv2d(sn.tensor(x), sn.tensor(w), None if b is None else sn.tensor(b), stride,
                   padding, dilation, groups)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    if bias:
        assert gradcheck(lambda x, w, b: F.conv2d(x, w, b, stride, padding, dilation, groups),
                         x, w, b)
    else:
        assert gradcheck(lambda x, w: F.conv2d(x, w, None, stride, padding, dilation, groups),
                         x, w)


def test_conv2d_xp_path_and_float32():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    grads = []
    for mode in ("numba", "xp"):
        with sn.kernels.use(mode):
            xt, wt = sn.tensor(x, requires_grad=True), sn.tensor(w, requires_grad=True)
            out = F.conv2d(xt, wt, stride=2, padding=1, groups=2)
            out.sum().backward()
            assert out.dtype == np.float32 and xt.grad.dtype == np.float32
            grads.append((out.numpy(), xt.grad.numpy(), wt.grad.numpy()))
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_conv1d_matches_loops_and_finite_differences():
    rng = np.random.default_rng(2)
    x, w, b = (rng.standard_normal(s) for s in ((2, 4, 11), (6, 2, 3), (6,)))
    want = conv2d_loops(x[:, :, None], w[:, :, None], b, (1, 2), ((0, 0), (1, 1)), (1, 2), 2)
    got = F.conv1d(sn.tensor(x), sn.tensor(w), sn.tensor(b), stride=2, padding=1,
                   dilation=2, groups=2)
    np.testing.assert_allclose(got.numpy(), want[:, :, 0], rtol=1e-12)
    assert gradcheck(lambda x, w, b: F.conv1d(x, w, b, 1, "same", 2), x,
                     rng.standard_normal((3, 4, 4)), rng.standard_normal(3))
    assert F.conv1d(sn.tensor(x[0]), sn.tensor(w), groups=2).shape == (6, 9)  # unbatched


def test_conv2d_errors():
    x, w = sn.zeros(1, 4, 5, 5), sn.zeros(2, 3, 3, 3)
    with pytest.raises(RuntimeError, match="channels"):
        F.conv2d(x, w)
    with pytest.raises(ValueError, match="strided"):
        F.conv2d(x, sn.zeros(2, 4, 3, 3), stride=2, padding="same")
    with pytest.raises(ValueError, match="padding string"):
        F.conv2d(x, sn.zeros(2, 4, 3, 3), padding="full")
    with pytest.raises(RuntimeError, match="too small"):
        F.conv2d(x, sn.zeros(2, 4, 7, 7))
    with pytest.raises(RuntimeError, match="dtype"):
        F.conv2d(x, sn.zeros(2, 4, 3, 3, dtype=sn.float64))


@pytest.mark.parametrize("cls,ks,shape", [(nn.Conv2d, 3, (8, 2, 3, 3)),
                                          (nn.Conv1d, 5, (8, 2, 5))])
def test_conv_modules_init_and_state_dict(cls, ks, shape):
    sn.manual_seed(0)
    m = cls(4, 8, ks, groups=2)
    assert list(m.state_dict()) == ["weight", "bias"]
    assert m.weight.shape == shape and m.bias.shape == (8,)
    fan_in = math.prod(shape[1:])
    bound = 1 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)): gain·sqrt(3/fan_in)
    for p in (m.weight, m.bias):
        v = p.numpy()
        assert np.abs(v).max() <= bound and np.abs(v).max() > 0.6 * bound
    assert cls(4, 8, ks, bias=False).bias is None
    assert list(nn.Sequential(cls(4, 8, ks)).state_dict()) == ["0.weight", "0.bias"]
    with pytest.raises(NotImplementedError, match="padding_mode"):
        cls(4, 8, ks, padding_mode="reflect")
    with pytest.raises(ValueError, match="divisible"):
        cls(3, 8, ks, groups=2)


def test_conv2d_module_forward_is_functional():
    m = nn.Conv2d(3, 5, (3, 2), stride=(2, 1), padding=1)
    x = sn.randn(2, 3, 7, 6)
    np.testing.assert_array_equal(m(x).numpy(),
                                  F.conv2d(x, m.weight, m.bias, (2, 1), 1).numpy())
    assert nn.Conv2d(3, 5, 3, padding="same")(x).shape == (2, 5, 7, 6)


# -- kernels against the xp code ---------------------------------------------------------
KERNEL_CASES = [((2, 3, 7, 6), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
                ((1, 2, 9, 8), (3, 2), (2, 1), ((2, 1), (1, 2)), (1, 2)),
                ((1, 1, 5, 7), (2, 4), (1, 3), ((0, 0), (3, 3)), (2, 1)),
                ((3, 2, 11, 13), (5, 5), (2, 2), ((0, 0), (0, 0)), (1, 1)),
                ((2, 3, 8, 8), (1, 1), (2, 2), ((0, 0), (0, 0)), (1, 1)),
                ((1, 2, 7, 9), (3, 3), (3, 2), ((1, 1), (2, 2)), (2, 3)),
                ((2, 3, 5, 33), (3, 3), (2, 1), ((1, 1), (1, 1)), (1, 1))]  # compiled copy


@pytest.mark.parametrize("shape,kernel,stride,pads,dilation", KERNEL_CASES)
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_col2im_kernel_matches_xp(shape, kernel, stride, pads, dilation, groups, dtype):
    """The kernel and ops.conv_columns.col2im_columns on the (N, Ho, Wo, G, kh, kw,
    C/G) columns, both against the window view's adjoint on (N, C, kh, kw,
    Ho, Wo); the kernel's and the reference's columns equal the window view."""
    rng = np.random.default_rng(3)
    shape = (shape[0], shape[1] * groups) + shape[2:]
    x = rng.standard_normal(shape).astype(dtype)
    padded, view = padded_windows(x, pads, kernel, stride, dilation)
    g = rng.standard_normal(view.shape).astype(dtype)
    want = col2im(g, padded.shape, pads, shape[2:], stride, dilation)
    n, c, kh, kw, ho, wo = g.shape
    as_rows = lambda a: np.ascontiguousarray(  # noqa: E731
        a.reshape(n, groups, c // groups, kh, kw, ho, wo).transpose(0, 5, 6, 1, 3, 4, 2))
    cols = as_rows(g)
    got = conv_kernels.col2im(cols, shape[2:], stride, pads, dilation)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(col2im_columns(cols, shape[2:], pads, stride, dilation), want,
                               rtol=1e-6, atol=1e-6)
    for mode in ("numba", "xp"):
        with sn.kernels.use(mode):
            built = columns(x, kernel, stride, pads, dilation, (ho, wo), groups)
        np.testing.assert_array_equal(built, as_rows(view))


@pytest.mark.skipif(PLAIN_PYTHON, reason="this is that subprocess")
def test_kernel_as_plain_python():
    run_plain_python_subprocess(__file__, "kernel_matches")


@pytest.mark.parametrize("mode", ["numba", "xp"])
def test_conv_empty_batch_and_strided_input(mode):
    """PyTorch accepts a batch of 0 (zero gradients); a permuted (non-contiguous)
    input gives the same result as its contiguous copy."""
    with sn.kernels.use(mode):
        x, w = sn.randn(0, 4, 8, 8, requires_grad=True), sn.randn(4, 2, 3, 3, requires_grad=True)
        out = F.conv2d(x, w, padding=1, groups=2)
        out.sum().backward()
        assert out.shape == (0, 4, 8, 8) and x.grad.shape == (0, 4, 8, 8)
        np.testing.assert_array_equal(w.grad.numpy(), np.zeros((4, 2, 3, 3)))
        a = np.random.default_rng(4).standard_normal((2, 7, 9, 3))
        w = sn.tensor(np.random.default_rng(5).standard_normal((5, 3, 3, 2)))
        permuted = F.conv2d(sn.tensor(a).permute(0, 3, 1, 2), w, stride=2, padding=1)
        copied = F.conv2d(sn.tensor(np.ascontiguousarray(a.transpose(0, 3, 1, 2))), w,
                          stride=2, padding=1)
        np.testing.assert_array_equal(permuted.numpy(), copied.numpy())
