"""Numba kernels (spmdnet.kernels) against their plain-xp references.

Every kernel, forward and backward, float32 and float64, on random and edge
shapes: empty, one element, odd, large, 3-D, non-contiguous, NaN/inf. Also
the float32 fast math against ``math``, and the plain-xp erf against
``math.erf`` and the kernels' own erf.

``test_plain_python`` runs this file again in a subprocess with
``NUMBA_DISABLE_JIT=1`` (kernel bodies as plain Python).
"""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from spmdnet import kernels, nn, optim
from spmdnet.kernels import activation, embedding, loss, norm, softmax, special
from spmdnet.kernels._cpu import CpuKernel
from spmdnet.ops import nn_ops, unary

PLAIN_PYTHON = os.environ.get("NUMBA_DISABLE_JIT") == "1"
DTYPES = [np.float32, np.float64]


def tol(dtype):
    """Kernels round differently (summation order, float32 polynomials)."""
    if np.dtype(dtype) == np.float32:  # torch.testing's float32 atol, looser rtol
        return {"rtol": 2e-5, "atol": 1e-5}
    return {"rtol": 1e-12, "atol": 1e-13}


def shapes():
    """Random and edge shapes of (rows, features) arrays; 'large' is big
    enough for the 8-way reductions' main loops and tails."""
    return [(7, 13), (0, 5), (1, 1), (3, 17), (2, 3, 5), (64, 1031)]


def arrays(shape, dtype, seed=0, special_values=False, contiguous=True):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(dtype) * 2
    if special_values and a.size >= 6:
        flat = a.reshape(-1)
        flat[[0, 2, 4, 5]] = [np.nan, np.inf, -np.inf, 0.0]
    if not contiguous:  # the same values, in every other column of a wider array
        wide = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
        wide[..., ::2] = a
        a = wide[..., ::2]
        assert not a.flags.c_contiguous
    return a


def cases():
    """(shape, special_values, contiguous) for the elementwise kernels."""
    out = [(s, False, True) for s in shapes()]
    return out + [((2, 9), True, True), ((2, 6), False, False)]


# -- float32 fast math ----------------------------------------------------------------
def _apply_body(a, out, which):
    for i in range(a.size):
        if which == 0:
            out[i] = special.exp(a[i])
        else:
            out[i] = special.erf(a[i])


_apply = CpuKernel(_apply_body)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which,ref", [(0, math.exp), (1, math.erf)])
def test_special_functions_match_math(dtype, which, ref):
    rng = np.random.default_rng(3)
    edges = [0.0, -0.0, 1e-30, -1e-30, 3e-4, 5e-4, 1.0, -1.0, 3.99, 4.0, 4.01, 7.9, 8.0, 20.0,
             -20.0, 88.7, 88.8, 89.0, -87.3, -87.4, -103.0, -104.0, -200.0, 709.0, 710.0,
             np.inf, -np.inf, np.nan]
    a = np.concatenate([rng.standard_normal(5000) * 3, rng.uniform(-100, 100, 2000),
                        edges]).astype(dtype)
    out = np.empty_like(a)
    _apply(a, out, which)

    def reference(v):
        if math.isnan(v):
            return math.nan
        try:
            return ref(v)
        except OverflowError:
            return math.inf
    expected = np.array([reference(float(v)) for v in a])
    if dtype == np.float32:  # subnormal results may be flushed to 0 (see special.py)
        with np.errstate(over="ignore"):
            np.testing.assert_allclose(out, expected.astype(np.float32), rtol=1e-6,
                                       atol=np.finfo(np.float32).tiny)
    else:
        np.testing.assert_allclose(out, expected, rtol=1e-15, atol=0)


def test_xp_erf_matches_math_and_the_kernels_erf():
    """kernels.erf is plain xp (no Numba): within 4 ulp of math.erf in
    float64; the kernels' float32 erf stays within 1e-6 of it."""
    rng = np.random.default_rng(4)
    edges = [0.0, -0.0, 5e-324, 1e-300, 0.46875, -0.46875, 0.5, 4.0, -4.0, 5.9, 6.0, 27.0,
             np.inf, -np.inf]
    x = np.concatenate([rng.standard_normal(20000) * 3, rng.uniform(-30, 30, 2000), edges])
    want = np.array([math.erf(v) for v in x])
    got = kernels.erf(x)
    assert got.dtype == np.float64
    assert np.all(np.abs(got - want) <= 4 * np.spacing(np.abs(want)))
    assert np.isnan(kernels.erf(np.array([np.nan]))).all()
    assert np.signbit(kernels.erf(np.array([-0.0]))[0])
    x32 = x.astype(np.float32)
    ref32 = kernels.erf(x32)
    assert ref32.dtype == np.float32
    want32 = np.array([math.erf(float(v)) for v in x32], np.float32)
    assert np.all(np.abs(ref32 - want32) <= np.spacing(np.abs(want32)))  # 1 ulp
    fast = np.empty_like(x32)
    _apply(x32, fast, 1)
    np.testing.assert_allclose(fast, ref32, rtol=1e-6, atol=np.finfo(np.float32).tiny)


# -- activations --------------------------------------------------------------------------
def _forward(name, x, bias, inplace):
    """The kernel's forward where it has one for this step, else the xp one
    (sigmoid: backward only, from what the xp forward saved)."""
    if name in (activation.FORWARD_INPLACE if inplace else activation.FORWARD):
        return activation.forward(x, bias, name, inplace=inplace)
    return unary.act_forward(name, x + bias if bias is not None else x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", activation.BACKWARD)
def test_activation_kernels_match_xp(name, dtype):
    for k, (shape, special_values, contiguous) in enumerate(cases()):
        x = arrays(shape, dtype, k, special_values, contiguous)
        g = arrays(shape, dtype, k + 100, special_values)
        bias = arrays(shape[-1:], dtype, k + 200)
        with np.errstate(all="ignore"):
            out_ref, saved_ref = unary.act_forward(name, x + bias)
            gx_ref = unary.act_backward(name, g, saved_ref)
            gb_ref = gx_ref.reshape(-1, shape[-1]).sum(axis=0)
            # with a bias, in place on a fresh buffer (the fused linear layer)
            h = np.ascontiguousarray(x)
            out, saved = _forward(name, h, bias, inplace=True)
            gx, gb = activation.backward(g, saved, name, bias_grad=True)
            # without a bias, input untouched (the activation ops)
            before = x.copy()
            out0, saved0 = _forward(name, x, None, inplace=False)
            gx0, gb0 = activation.backward(g, saved0, name)
            out0_ref, saved0_ref = unary.act_forward(name, x)
            gx0_ref = unary.act_backward(name, g, saved0_ref)
        assert gb0 is None
        np.testing.assert_array_equal(x, before)
        if name == "relu":
            assert out is h  # in place
        for got, want in [(out, out_ref), (gx, gx_ref), (out0, out0_ref), (gx0, gx0_ref)]:
            assert got.shape == want.shape and got.dtype == dtype
            np.testing.assert_allclose(got, want, **tol(dtype), err_msg=f"{shape}")
        rows = max(1, x.size // max(1, shape[-1]))  # gb sums rows: rounding adds up
        np.testing.assert_allclose(gb, gb_ref, rtol=tol(dtype)["rtol"],
                                   atol=tol(dtype)["atol"] * rows, err_msg=f"{shape}")
        if name == "relu":  # plain comparisons and sums in row order: the same bits
            for got, want in [(out, out_ref), (gx, gx_ref), (gb, gb_ref)]:
                np.testing.assert_array_equal(got, want)
        with np.errstate(all="ignore"):  # what one side saved, the other can use
            mixed = [unary.act_backward(name, g, saved),
                     activation.backward(g, saved_ref, name)[0]]
        for got in mixed:
            np.testing.assert_allclose(got, gx_ref, **tol(dtype), err_msg=f"{shape}")


def test_activation_backward_writes_bias_gradient_into_buffer():
    x, g = arrays((5, 7), np.float32), arrays((5, 7), np.float32, 1)
    out, saved = activation.forward(x.copy(), np.ones(7, np.float32), "gelu", inplace=True)
    buf = np.full(7, np.nan, np.float32)
    _, gb = activation.backward(g, saved, "gelu", bias_grad=True, bias_out=buf)
    assert gb is buf and np.isfinite(buf).all()


def test_activation_wrappers_reject_bad_input():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="activation must be one of"):
        activation.forward(x, None, "swish")
    with pytest.raises(ValueError, match=r"\['relu', 'gelu', 'gelu_tanh'\] for the forward"):
        activation.forward(x, None, "sigmoid")  # sigmoid: a backward kernel only
    with pytest.raises(ValueError, match="in-place forward kernels, got 'tanh'"):
        activation.forward(x, None, "tanh", inplace=True)
    with pytest.raises(ValueError, match="backward kernels, got 'tanh'"):
        activation.backward(x, x, "tanh")
    with pytest.raises(ValueError, match="does not match the last axis"):
        activation.forward(x, np.ones(4, np.float32), "gelu")
    with pytest.raises(TypeError, match="float32 or float64"):
        activation.forward(x.astype(np.float16), None, "gelu")
    with pytest.raises(TypeError, match="float32 or float64"):
        activation.forward(x, np.ones(3, np.float64), "gelu")
    with pytest.raises(ValueError, match="C-contiguous"):
        activation.forward(np.ones((3, 2), np.float32).T, None, "relu", inplace=True)
    with pytest.raises(ValueError, match="does not match the saved"):
        activation.backward(x, np.ones((3, 2), np.float32), "relu")


# -- cross-entropy ------------------------------------------------------------------------
def ce_reference(logits, labels, scale):
    with np.errstate(all="ignore"):
        logp = nn_ops._log_softmax(logits, axis=1)
        rows = np.arange(len(labels))
        grad = np.exp(logp)
        grad[rows, labels] -= 1
        return -logp[rows, labels], grad * scale[:, None]


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_kernels_match_xp(dtype):
    sizes = [(3, 13), (1, 1), (2, 17), (0, 4), (7, 2), (64, 1031), (8, 32000)]
    for k, (n, c) in enumerate(sizes):
        rng = np.random.default_rng(k)
        logits = arrays((n, c), dtype, k) * 3
        labels = rng.integers(0, c, n) if c else np.zeros(n, np.int64)
        scale = rng.uniform(0.5, 2, n).astype(dtype)
        losses, probs = loss.forward(logits, labels)
        grad = loss.backward(probs, labels, scale)
        want_losses, want_grad = ce_reference(logits, labels, scale)
        np.testing.assert_allclose(losses, want_losses, **tol(dtype), err_msg=f"{n}x{c}")
        np.testing.assert_allclose(grad, want_grad, **tol(dtype), err_msg=f"{n}x{c}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_kernels_nan_inf_and_layout(dtype):
    logits = arrays((6, 8), dtype, 5)
    logits[1, 3], logits[2, 0], logits[3, 5], logits[4, :] = np.nan, np.inf, -np.inf, -np.inf
    labels = np.array([0, 1, 2, 3, 4, 7], np.int32)
    scale = np.full(6, 1 / 6, dtype)
    with np.errstate(all="ignore"):  # inf - inf (plain Python warns)
        losses, probs = loss.forward(logits, labels)
        grad = loss.backward(probs, labels, scale)
    want_losses, want_grad = ce_reference(logits, labels, scale)
    np.testing.assert_allclose(losses, want_losses, **tol(dtype))
    np.testing.assert_allclose(grad, want_grad, **tol(dtype))
    strided = arrays((6, 8), dtype, 6, contiguous=False)
    np.testing.assert_allclose(loss.forward(strided, labels)[0],
                               ce_reference(strided, labels, scale)[0], **tol(dtype))


def test_cross_entropy_kernel_rejects_bad_labels():
    logits = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="out of range"):
        loss.forward(logits, np.array([0, 4, 1]))
    with pytest.raises(TypeError, match="integers"):
        loss.forward(logits, np.array([0.0, 1.0, 1.0]))


# -- layer norm ---------------------------------------------------------------------------
def layer_norm_reference(x, g, weight):
    op = nn_ops.LayerNorm()
    affine = (weight, weight[::-1].copy()) if weight is not None else ()
    op.needs_input_grad = (True,) * (1 + len(affine))
    with np.errstate(all="ignore"), kernels.use("xp"):
        out = op.forward(x, *affine, eps=1e-5)
        grads = op.backward(g)
    return (out, grads) if affine else (out, (grads, None, None))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_kernels_match_xp(dtype, affine):
    for k, (shape, special_values, contiguous) in enumerate(cases()):
        if shape[-1] == 0 or math.prod(shape) == 0:
            continue
        x = arrays(shape, dtype, k, special_values, contiguous) + 1
        g = arrays(shape, dtype, k + 1)
        weight = arrays(shape[-1:], dtype, k + 2) if affine else None
        bias = weight[::-1].copy() if affine else None
        want_out, (want_gx, want_gw, want_gb) = layer_norm_reference(x, g, weight)
        with np.errstate(all="ignore"):
            out, mean, rstd = norm.forward(x, weight, bias, eps=1e-5)
            gx, gw, gb = norm.backward(g, x, weight, mean, rstd)
        assert mean.shape == rstd.shape == shape[:-1]
        np.testing.assert_allclose(out, want_out, **tol(dtype), err_msg=f"{shape}")
        np.testing.assert_allclose(gx, want_gx, **tol(dtype), err_msg=f"{shape}")
        if affine:  # gw sums rows of g * xhat: tolerance grows with the row count
            np.testing.assert_allclose(gw, want_gw, rtol=tol(dtype)["rtol"] * 10,
                                       atol=tol(dtype)["atol"] * max(1, x.size // shape[-1]))
            np.testing.assert_allclose(gb, want_gb, **tol(dtype))
        else:
            assert gw is None and gb is None


def test_layer_norm_kernels_edges_and_buffers():
    x = np.zeros((0, 4), np.float32)
    out, mean, rstd = norm.forward(x, None, None)
    assert out.shape == (0, 4) and mean.shape == (0,)
    w = np.ones(4, np.float32)
    gx, gw, gb = norm.backward(x, x, w, mean, rstd)
    assert gx.shape == (0, 4) and (gw == 0).all() and (gb == 0).all()
    x, g = arrays((3, 4), np.float32), arrays((3, 4), np.float32, 1)
    _, mean, rstd = norm.forward(x, w, w)
    bw, bb = np.full(4, np.nan, np.float32), np.full(4, np.nan, np.float32)
    _, gw, gb = norm.backward(g, x, w, mean, rstd, weight_out=bw, bias_out=bb)
    assert gw is bw and gb is bb and np.isfinite(bw).all()
    np.testing.assert_allclose(gb, g.sum(axis=0), rtol=1e-6)
    with pytest.raises(ValueError, match="both weight and bias"):
        norm.forward(x, w, None)


# -- softmax ------------------------------------------------------------------------------
def softmax_reference(x, g):
    op = nn_ops.Softmax()
    with np.errstate(all="ignore"), kernels.use("xp"):
        y = op.forward(x, axis=-1)
        return y, op.backward(g)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_kernels_match_xp(dtype):
    for k, (shape, special_values, contiguous) in enumerate(cases()):
        x = arrays(shape, dtype, k, special_values, contiguous)
        g = arrays(shape, dtype, k + 1)
        want_y, want_gx = softmax_reference(x, g)
        with np.errstate(all="ignore"):
            y = softmax.forward(x)
            gx = softmax.backward(g, y)
        assert y.shape == gx.shape == shape and y.dtype == gx.dtype == dtype
        np.testing.assert_allclose(y, want_y, **tol(dtype), err_msg=f"{shape}")
        np.testing.assert_allclose(gx, want_gx, **tol(dtype), err_msg=f"{shape}")
        with np.errstate(all="ignore"):
            y2, lse = softmax.forward_lse(x)
            want_lse = np.log(np.exp(x.astype(np.float64)).sum(axis=-1))
            again = softmax.from_lse(x, lse)
        assert lse.shape == shape[:-1] and lse.dtype == dtype
        np.testing.assert_array_equal(y2, y)
        np.testing.assert_allclose(lse, want_lse, **tol(dtype), err_msg=f"{shape}")
        np.testing.assert_allclose(again, y, **tol(dtype), err_msg=f"{shape}")


def test_softmax_kernels_masked_rows():
    """-inf entries (a causal mask) weigh 0; a row that is all -inf gives NaN
    as in PyTorch; a row with +inf gives NaN too (inf - inf)."""
    x = arrays((4, 9), np.float32)
    x[0, 3:] = -np.inf
    x[1, :] = -np.inf
    x[2, 5] = np.inf
    with np.errstate(all="ignore"):
        y = softmax.forward(x)
    e = np.exp(x[0, :3] - x[0, :3].max())
    np.testing.assert_allclose(y[0], np.r_[e / e.sum(), np.zeros(6)], rtol=2e-6, atol=0)
    assert np.isnan(y[1]).all() and np.isnan(y[2]).any()
    np.testing.assert_allclose(y[3].sum(), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="differ"):
        softmax.backward(x[:2], y)


# -- embedding ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_backward_matches_add_at_bit_for_bit(dtype):
    rng = np.random.default_rng(0)
    sizes = [((5,), 4, 3), ((2, 3), 6, 5), ((0,), 3, 2), ((1,), 1, 1), ((4,), 3, 0),
             ((4096,), 1000, 64)]
    for idx_shape, num, d in sizes:
        idx = rng.integers(0, num, idx_shape)
        g = arrays(idx_shape + (d,), dtype, 1)
        want = np.zeros((num, d), dtype)
        np.add.at(want, idx.reshape(-1), g.reshape(idx.size, d))
        np.testing.assert_array_equal(embedding.backward(g, idx, num), want)
        buf = np.full((num, d), np.nan, dtype)
        assert embedding.backward(g, idx, num, out=buf) is buf
        np.testing.assert_array_equal(buf, want)
    with pytest.raises(ValueError, match="out of range"):
        embedding.backward(np.ones((2, 3), dtype), np.array([0, 5]), 4)


# -- optimizer updates (more in test_optim.py, which runs every optimizer test both ways) --
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.5, dampening=0.2),
    lambda ps: optim.Adam(ps, lr=0.01, weight_decay=0.01),
    lambda ps: optim.AdamW(ps, lr=0.01)], ids=["sgd-nesterov", "sgd-damp", "adam", "adamw"])
def test_optimizer_kernels_match_xp(dtype, make):
    results = []
    for mode in ("numba", "xp"):
        params = []
        for k, (shape, special_values, _) in enumerate(cases()):
            p = nn.Parameter(arrays(shape, dtype, k))
            p.grad = arrays(shape, dtype, k + 50, special_values)
            params.append(p)
        opt = make(params)
        with np.errstate(all="ignore"), kernels.use(mode):
            for _ in range(3):
                opt.step()
        results.append([p.numpy() for p in params])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, **tol(dtype))


# -- the same tests with the kernel bodies as plain Python -------------------------------------
@pytest.mark.skipif(PLAIN_PYTHON, reason="this is that subprocess")
def test_plain_python():
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__],
        env=env, capture_output=True, text=True, timeout=600,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
