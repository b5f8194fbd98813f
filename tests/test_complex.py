"""Complex tensors (issue 23 item 6): views, parts, polar, and gradients in
PyTorch's convention (for a real loss L, the gradient of complex z is
dL/dRe z + i dL/dIm z), checked against float64 central differences taken
separately along the real and the imaginary part; a LLaMA-style rotary
embedding forward against the closed-form rotation and backward against
finite differences; the same on CuPy."""
import numpy as np
import pytest

import spmdnet as sn
from spmdnet.backend import cupy_available

RNG = np.random.default_rng(23)


def numeric_grad(loss, arrays, index, eps=1e-6):
    """d loss / d arrays[index], real or complex (dL/dRe + i dL/dIm), by
    central differences; ``loss`` maps host arrays to a float."""
    base = arrays[index]
    out = np.zeros(base.shape, base.dtype)
    directions = [1.0, 1j] if base.dtype.kind == "c" else [1.0]
    for pos in np.ndindex(base.shape):
        for d in directions:
            plus, minus = base.copy(), base.copy()
            plus[pos] += eps * d
            minus[pos] -= eps * d
            args_p = arrays[:index] + [plus] + arrays[index + 1:]
            args_m = arrays[:index] + [minus] + arrays[index + 1:]
            out[pos] += d * (loss(*args_p) - loss(*args_m)) / (2 * eps)
    return out


def check_grads(fn, *arrays, tol=1e-7):
    """fn maps tensors to a real 0-d tensor; every input's gradient against
    finite differences of the same fn on fresh tensors."""
    leaves = [sn.tensor(a, requires_grad=True) for a in arrays]
    fn(*leaves).backward()
    as_loss = lambda *xs: float(fn(*[sn.tensor(x) for x in xs]).item())  # noqa: E731
    for i, leaf in enumerate(leaves):
        want = numeric_grad(as_loss, list(arrays), i)
        assert leaf.grad.dtype == arrays[i].dtype, (i, leaf.grad.dtype)
        np.testing.assert_allclose(leaf.grad.numpy(), want, rtol=tol, atol=tol, err_msg=str(i))


def crandn(*shape):
    return RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)


def weights(*shape):
    """Fixed real weights so a loss sees every real and imaginary part differently."""
    return sn.tensor(RNG.standard_normal(shape + (2,)))


def real_loss(z, w):
    """sum(w · view_as_real(z)): a real loss weighting Re and Im apart."""
    return (sn.view_as_real(z) * w).sum()


# -- PyTorch's convention, hand-computed ------------------------------------------------------
@pytest.mark.parametrize("form", ["parts", "abs", "conj", "view"])
def test_abs_squared_at_one_plus_one_j_gives_two_plus_two_j(form):
    z = sn.tensor([1 + 1j], dtype=sn.complex128, requires_grad=True)
    loss = {"parts": lambda: (z.real ** 2 + z.imag ** 2).sum(),
            "abs": lambda: (z.abs() ** 2).sum(),
            "conj": lambda: (z * z.conj()).real.sum(),
            "view": lambda: sn.view_as_real(z).pow(2).sum()}[form]()
    assert loss.item() == pytest.approx(2.0)
    loss.backward()
    np.testing.assert_allclose(z.grad.numpy(), [2 + 2j], rtol=1e-15)


def test_dtypes_and_defaults():
    assert sn.complex64 == sn.cfloat == np.complex64
    assert sn.complex128 == sn.cdouble == np.complex128
    assert sn.tensor([1 + 2j]).dtype == np.complex64  # PyTorch: the default float's twin
    assert sn.tensor(np.array([1 + 2j])).dtype == np.complex128  # arrays keep theirs
    assert (sn.tensor([1.0]) * 1j).dtype == np.complex64
    assert sn.tensor([1 + 2j]).is_complex() and not sn.tensor([1.0]).is_complex()


def test_float64_default_gives_complex128(float64):
    assert sn.tensor([1j]).dtype == np.complex128


# -- views share memory -----------------------------------------------------------------------
def test_view_as_complex_and_real_share_memory():
    x = sn.arange(8.0).reshape(2, 2, 2)
    z = sn.view_as_complex(x)
    assert z.shape == (2, 2) and z.dtype == np.complex64
    np.testing.assert_array_equal(z.numpy(), [[1j, 2 + 3j], [4 + 5j, 6 + 7j]])
    z[0, 1] = 9 - 1j
    assert x[0, 1, 0].item() == 9 and x[0, 1, 1].item() == -1
    r = sn.view_as_real(z)
    assert r.shape == (2, 2, 2)
    r[1, 0, 1] = 42.0
    assert z[1, 0].item() == 4 + 42j and x[1, 0, 1].item() == 42


def test_real_and_imag_are_views():
    z = sn.tensor([1 + 2j, 3 - 4j])
    z.real[0] = 10.0
    z.imag[1] = 7.0
    np.testing.assert_array_equal(z.numpy(), [10 + 2j, 3 + 7j])
    x = sn.tensor([1.0, 2.0])
    assert x.real is x  # PyTorch: a real tensor's .real is itself
    with pytest.raises(RuntimeError, match="imag is not implemented"):
        _ = x.imag


def test_view_of_a_transposed_view_as_real():
    z = sn.tensor(crandn(3, 4)).t()
    r = sn.view_as_real(z)
    np.testing.assert_array_equal(r.numpy()[..., 0], z.numpy().real)
    np.testing.assert_array_equal(r.numpy()[..., 1], z.numpy().imag)


def test_view_as_complex_errors_name_the_problem():
    with pytest.raises(RuntimeError, match="last dimension of size 2"):
        sn.view_as_complex(sn.zeros(2, 3))
    with pytest.raises(RuntimeError, match="stride 1"):
        sn.view_as_complex(sn.zeros(2, 2).t())
    with pytest.raises(RuntimeError, match="stride divisible by 2"):
        sn.view_as_complex(sn.zeros(3, 5)[:, 1:3])
    with pytest.raises(RuntimeError, match="float32 and float64"):
        sn.view_as_complex(sn.zeros(2, 2, dtype=sn.int64))
    with pytest.raises(RuntimeError, match="only supported for complex"):
        sn.view_as_real(sn.zeros(2))


def test_polar_and_complex_closed_forms():
    r, theta = RNG.random(5) + 0.5, RNG.uniform(-np.pi, np.pi, 5)
    z = sn.polar(sn.tensor(r), sn.tensor(theta))
    assert z.dtype == np.complex128
    np.testing.assert_allclose(z.numpy(), r * np.exp(1j * theta), rtol=1e-15)
    np.testing.assert_allclose(sn.angle(z).numpy(), theta, rtol=1e-13)
    np.testing.assert_allclose(sn.complex(sn.tensor(r), sn.tensor(theta)).numpy(),
                               r + 1j * theta)
    with pytest.raises(RuntimeError, match="float32 or float64 of one dtype"):
        sn.polar(sn.ones(2), sn.ones(2, dtype=sn.float64))


# -- gradients against finite differences -----------------------------------------------------
BINARY = {"mul": lambda a, b: a * b, "add": lambda a, b: a + b, "sub": lambda a, b: a - b,
          "div": lambda a, b: a / b, "pow": lambda a, b: a ** b}


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_complex_gradients(op):
    a, b = crandn(2, 3), crandn(3)  # broadcast: b's gradient is summed over rows
    w = weights(2, 3)
    check_grads(lambda x, y: real_loss(BINARY[op](x, y), w), a, b)


@pytest.mark.parametrize("op", ["mul", "add", "div"])
def test_real_with_complex_gradients_are_real(op):
    x, z = RNG.standard_normal((2, 3)), crandn(2, 3)
    w = weights(2, 3)
    check_grads(lambda a, b: real_loss(BINARY[op](a, b), w), x, z)


UNARY = {"exp": sn.exp, "log": sn.log, "sqrt": sn.sqrt, "sin": sn.sin, "cos": sn.cos,
         "conj": sn.conj, "neg": lambda z: -z, "square": lambda z: z * z}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_complex_gradients(op):
    w = weights(4)
    check_grads(lambda z: real_loss(UNARY[op](z), w), crandn(4))


@pytest.mark.parametrize("part", ["real", "imag", "abs", "angle"])
def test_real_valued_parts_gradients(part):
    w = sn.tensor(RNG.standard_normal(4))
    fn = {"real": lambda z: z.real, "imag": lambda z: z.imag, "abs": sn.abs,
          "angle": sn.angle}[part]
    check_grads(lambda z: (fn(z) * w).sum(), crandn(4))


def test_polar_and_complex_gradients():
    w = weights(2, 3)
    r, theta = RNG.random((2, 3)) + 0.5, RNG.standard_normal(3)
    check_grads(lambda a, t: real_loss(sn.polar(a, t.expand(2, 3)), w), r, theta)
    check_grads(lambda a, b: real_loss(sn.complex(a, b), w), r, RNG.standard_normal((2, 3)))


def test_view_as_complex_gradient():
    w = weights(3, 2)
    check_grads(lambda x: real_loss(sn.view_as_complex(x) ** 2, w),
                RNG.standard_normal((3, 2, 2)))


# -- rotary embeddings, LLaMA's code unchanged ------------------------------------------------
# LLaMA's functions as written, except that ``cast`` names the ``.float()``
# calls (float32, as in LLaMA) so the gradient checks can run in float64
def precompute_freqs_cis(dim, end, theta=10000.0, torch=sn, cast="float"):
    freqs = 1.0 / (theta ** (getattr(torch.arange(0, dim, 2)[: (dim // 2)], cast)() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = getattr(torch.outer(t, freqs), cast)()
    return torch.polar(torch.ones_like(freqs), freqs)


def reshape_for_broadcast(freqs_cis, x):
    ndim = x.ndim
    assert 0 <= 1 < ndim
    assert freqs_cis.shape == (x.shape[1], x.shape[-1])
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis, torch=sn, cast="float"):
    xq_ = torch.view_as_complex(getattr(xq, cast)().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(getattr(xk, cast)().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def rotary_closed_form(x, positions_dim):
    """Each pair (x[2i], x[2i+1]) at position t rotated by t·θ^(-2i/dim)."""
    b, t, h, dim = x.shape
    angle = np.arange(t)[:, None] * 10000.0 ** (-np.arange(0, dim, 2) / dim)
    cos, sin = np.cos(angle)[None, :, None, :], np.sin(angle)[None, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


@pytest.mark.parametrize("cast", ["float", "double"])
def test_rotary_embedding_forward_matches_the_rotation(cast):
    xq, xk = RNG.standard_normal((2, 5, 3, 8)), RNG.standard_normal((2, 5, 3, 8))
    freqs = precompute_freqs_cis(8, 5, cast=cast)
    assert freqs.dtype == (np.complex64 if cast == "float" else np.complex128)
    q, k = apply_rotary_emb(sn.tensor(xq), sn.tensor(xk), freqs, cast=cast)
    tol = 1e-5 if cast == "float" else 1e-12
    np.testing.assert_allclose(q.numpy(), rotary_closed_form(xq, 8), rtol=tol, atol=tol)
    np.testing.assert_allclose(k.numpy(), rotary_closed_form(xk, 8), rtol=tol, atol=tol)
    assert q.dtype == np.float64 and q.shape == xq.shape  # type_as(xq): back to float64


def test_rotary_embedding_backward_against_finite_differences(float64):
    freqs = precompute_freqs_cis(4, 3, cast="double")
    wq, wk = sn.tensor(RNG.standard_normal((1, 3, 2, 4))), sn.tensor(RNG.standard_normal(4))

    def loss(xq, xk):
        q, k = apply_rotary_emb(xq, xk, freqs, cast="double")
        return (q * wq).sum() + (k * wk).sum() + (q * k).sum()
    check_grads(loss, RNG.standard_normal((1, 3, 2, 4)), RNG.standard_normal((1, 3, 2, 4)))


def test_rotary_embedding_gradient_is_the_inverse_rotation(float64):
    # a rotation's gradient is the rotation back: d sum(w·R x)/dx = R^T w
    x, w = RNG.standard_normal((1, 4, 1, 6)), RNG.standard_normal((1, 4, 1, 6))
    xt = sn.tensor(x, requires_grad=True)
    freqs = precompute_freqs_cis(6, 4, cast="double")
    q, _ = apply_rotary_emb(xt, sn.tensor(x), freqs, cast="double")
    (q * sn.tensor(w)).sum().backward()
    flipped = w.copy()  # R^T is the rotation by -angle: conjugate by flipping the odd sign
    flipped[..., 1::2] *= -1
    inverse = rotary_closed_form(flipped, 6)
    inverse[..., 1::2] *= -1
    np.testing.assert_allclose(xt.grad.numpy(), inverse, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_rotary_embedding_on_cupy_matches_numpy():
    assert cupy_available()
    xq = RNG.standard_normal((2, 5, 3, 8)).astype(np.float32)
    freqs = precompute_freqs_cis(8, 5)
    host = sn.tensor(xq, requires_grad=True)
    dev = sn.tensor(xq, device="gpu", requires_grad=True)
    outs = []
    for x, f in ((host, freqs), (dev, freqs.to("gpu"))):
        q, _ = apply_rotary_emb(x, x, f)
        (q * q * 0.5 + q).sum().backward()
        outs.append((q.numpy(), x.grad.numpy()))
    np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=1e-5, atol=1e-5)
    z = sn.tensor([1 + 1j], device="gpu", requires_grad=True)
    (z.abs() ** 2).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), [2 + 2j], rtol=1e-6)


def test_random_complex_draws_have_pytorchs_moments():
    sn.manual_seed(0)
    z = sn.randn(200000, dtype=sn.cfloat).numpy()  # E|z|² = 1: each part N(0, 1/2)
    assert z.dtype == np.complex64
    assert abs(z.real.var() - 0.5) < 0.01 and abs(z.imag.var() - 0.5) < 0.01
    assert abs(np.mean(z.real * z.imag)) < 0.01  # the parts are independent draws
    u = sn.rand(200000, dtype=sn.cdouble).numpy()
    assert 0 <= u.real.min() and u.real.max() < 1 and 0 <= u.imag.min() and u.imag.max() < 1
    assert abs(u.imag.mean() - 0.5) < 0.01


def test_backward_from_a_complex_scalar_needs_a_gradient():
    z = sn.tensor([1 + 1j], requires_grad=True)
    with pytest.raises(RuntimeError, match="only for real scalar outputs"):
        (z * 2).sum().backward()
    (z * 2).sum().backward(sn.tensor(1 + 0j))  # an explicit gradient is fine, as PyTorch
    np.testing.assert_allclose(z.grad.numpy(), [2 + 0j])
