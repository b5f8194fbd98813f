"""conv_transpose2d / conv_transpose1d and nn.ConvTranspose1d/2d against a
hand-written scatter-add definition (every input element adds its weighted
kernel into the output), float64 finite differences, and the adjoint
identity <conv2d(y, w), x> = <y, conv_transpose2d(x, w)>; PyTorch's output
sizes, init and output_size argument."""
import math

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import nn
from spmdnet.autograd import gradcheck


def conv_transpose2d_scatter(x, w, b, stride, padding, output_padding, groups, dilation):
    """The definition: out[n, g·O/G + o, h·s - p + i·d, v·s - p + j·d] +=
    x[n, c, h, v] · w[c, o, i, j], for every c of group g, cut to the output."""
    n, c_in, h, wd = x.shape
    _, og, kh, kw = w.shape
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = stride, padding, output_padding, dilation
    ho = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    wo = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    out = np.zeros((n, og * groups, ho, wo))
    cg = c_in // groups
    for b_ in range(n):
        for c in range(c_in):
            g = c // cg
            for r in range(h):
                for s in range(wd):
                    for o in range(og):
                        for i in range(kh):
                            for j in range(kw):
                                rr, ss = r * sh - ph + i * dh, s * sw - pw + j * dw
                                if 0 <= rr < ho and 0 <= ss < wo:
                                    out[b_, g * og + o, rr, ss] += x[b_, c, r, s] * w[c, o, i, j]
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out


CASES = [  # x shape, w shape, stride, padding, output_padding, groups, dilation
    ((2, 3, 4, 5), (3, 2, 3, 3), (1, 1), (0, 0), (0, 0), 1, (1, 1)),
    ((1, 2, 3, 4), (2, 3, 3, 2), (2, 3), (1, 0), (1, 2), 1, (1, 1)),
    ((2, 4, 3, 3), (4, 1, 3, 3), (2, 2), (1, 1), (0, 1), 2, (2, 1)),
    ((1, 3, 5, 4), (3, 1, 3, 3), (1, 1), (1, 1), (0, 0), 3, (1, 1)),   # depthwise
    ((1, 2, 3, 3), (2, 2, 2, 3), (1, 2), (0, 1), (1, 0), 1, (3, 2)),   # output_padding < d
    ((2, 1, 1, 1), (1, 2, 4, 4), (2, 2), (0, 0), (0, 0), 1, (1, 1)),
]


@pytest.mark.parametrize("xs,ws,stride,padding,output_padding,groups,dilation", CASES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mode", ["numba", "xp"])
def test_conv_transpose2d_matches_scatter_and_finite_differences(
        xs, ws, stride, padding, output_padding, groups, dilation, bias, mode):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    b = rng.standard_normal(ws[1] * groups) if bias else None
    want = conv_transpose2d_scatter(x, w, b, stride, padding, output_padding, groups, dilation)
    args = (stride, padding, output_padding, groups, dilation)
    with sn.kernels.use(mode):
        got = F.conv_transpose2d(sn.tensor(x), sn.tensor(w),
                                 None if b is None else sn.tensor(b), *args)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
        if bias:
            assert gradcheck(lambda x, w, b: F.conv_transpose2d(x, w, b, *args), x, w, b)
        else:
            assert gradcheck(lambda x, w: F.conv_transpose2d(x, w, None, *args), x, w)


def test_conv_transpose2d_is_the_adjoint_of_conv2d():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 2, 3, 3))  # conv2d: 4 -> 6 channels, groups 2
    y = rng.standard_normal((2, 4, 9, 8))
    out = F.conv2d(sn.tensor(y), sn.tensor(w), stride=2, padding=1, groups=2).numpy()
    x = rng.standard_normal(out.shape)
    back = F.conv_transpose2d(sn.tensor(x), sn.tensor(w), stride=2, padding=1,
                              output_padding=(0, 1), groups=2).numpy()
    assert back.shape == y.shape
    np.testing.assert_allclose((out * x).sum(), (y * back).sum(), rtol=1e-12)


def test_conv_transpose2d_float32_kernel_equals_xp():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    results = []
    for mode in ("numba", "xp"):
        with sn.kernels.use(mode):
            xt, wt = sn.tensor(x, requires_grad=True), sn.tensor(w, requires_grad=True)
            out = F.conv_transpose2d(xt, wt, stride=2, padding=1, output_padding=1, groups=1)
            (out * out).sum().backward()
            assert out.dtype == np.float32 and xt.grad.dtype == np.float32
            results.append((out.numpy(), xt.grad.numpy(), wt.grad.numpy()))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_conv_transpose1d_matches_scatter_and_finite_differences():
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(s) for s in ((2, 4, 6), (4, 3, 3), (6,)))
    want = conv_transpose2d_scatter(x[:, :, None], w[:, :, None], b, (1, 2), (0, 1), (0, 1),
                                    2, (1, 2))
    got = F.conv_transpose1d(sn.tensor(x), sn.tensor(w), sn.tensor(b), stride=2, padding=1,
                             output_padding=1, groups=2, dilation=2)
    np.testing.assert_allclose(got.numpy(), want[:, :, 0], rtol=1e-12)
    assert gradcheck(lambda x, w, b: F.conv_transpose1d(x, w, b, 3, 2, 1), x,
                     rng.standard_normal((4, 2, 4)), rng.standard_normal(2))
    assert F.conv_transpose1d(sn.tensor(x[0]), sn.tensor(w), groups=2).shape == (6, 8)


def test_conv_transpose_errors():
    x, w = sn.zeros(1, 4, 5, 5), sn.zeros(4, 2, 3, 3)
    with pytest.raises(RuntimeError, match="output padding"):
        F.conv_transpose2d(x, w, stride=2, output_padding=2)
    with pytest.raises(RuntimeError, match="channels"):
        F.conv_transpose2d(sn.zeros(1, 3, 5, 5), w)
    with pytest.raises(RuntimeError, match="string padding"):
        F.conv_transpose2d(x, w, padding="same")
    with pytest.raises(RuntimeError, match="too small"):
        F.conv_transpose2d(sn.zeros(1, 4, 1, 1), w, padding=2)
    with pytest.raises(RuntimeError, match="dtype"):
        F.conv_transpose2d(x, sn.zeros(4, 2, 3, 3, dtype=sn.float64))


@pytest.mark.parametrize("cls,ks,shape", [(nn.ConvTranspose2d, 3, (4, 4, 3, 3)),
                                          (nn.ConvTranspose1d, 5, (4, 4, 5))])
def test_conv_transpose_modules_init_and_state_dict(cls, ks, shape):
    sn.manual_seed(0)
    m = cls(4, 8, ks, groups=2)
    assert list(m.state_dict()) == ["weight", "bias"]
    assert m.weight.shape == shape and m.bias.shape == (8,)
    fan_in = math.prod(shape[1:])  # PyTorch's: the weight's dim 1 (out/groups) · kernel
    bound = 1 / math.sqrt(fan_in)
    for p in (m.weight, m.bias):
        v = p.numpy()
        assert np.abs(v).max() <= bound and np.abs(v).max() > 0.6 * bound
    assert cls(4, 8, ks, bias=False).bias is None
    with pytest.raises(ValueError, match="divisible"):
        cls(3, 8, ks, groups=2)
    with pytest.raises(NotImplementedError, match="padding_mode"):
        cls(4, 8, ks, padding_mode="reflect")


def test_conv_transpose2d_module_output_size_and_repr():
    m = nn.ConvTranspose2d(3, 5, 3, stride=2, padding=1, output_padding=(1, 0), dilation=1)
    assert "output_padding=(1, 0)" in repr(m)
    x = sn.randn(2, 3, 4, 5)
    out = m(x)
    assert out.shape == (2, 5, 8, 9)
    np.testing.assert_array_equal(
        out.numpy(), F.conv_transpose2d(x, m.weight, m.bias, 2, 1, (1, 0)).numpy())
    assert m(x, output_size=(7, 10)).shape == (2, 5, 7, 10)
    assert m(x, output_size=[2, 5, 8, 9]).shape == (2, 5, 8, 9)
    with pytest.raises(ValueError, match="valid sizes range from 7 to 8"):
        m(x, output_size=(9, 9))


def test_conv_transpose2d_empty_batch():
    x, w = sn.randn(0, 4, 3, 3, requires_grad=True), sn.randn(4, 2, 3, 3, requires_grad=True)
    out = F.conv_transpose2d(x, w, stride=2, groups=2)
    out.sum().backward()
    assert out.shape == (0, 4, 7, 7) and x.grad.shape == (0, 4, 3, 3)
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros((4, 2, 3, 3)))
