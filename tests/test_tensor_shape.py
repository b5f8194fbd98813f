"""Tensor shape methods with PyTorch's semantics: forward against a NumPy
expression, backward against float64 finite differences, and the cases
where NumPy's reading of the same name gives a silently wrong answer
pinned with values computed by hand from PyTorch's documentation."""
import warnings

import numpy as np
import pytest
from spmdnet.autograd import gradcheck
from spmdnet.backend import asnumpy

import spmdnet as sn

rng = np.random.default_rng(14)


def randn(*shape):
    return rng.standard_normal(shape)


MASK = np.array([True, False, True, True, False])
MASK2 = rng.standard_normal((3, 5)) > 0

# name, tensor function, NumPy reference, inputs
CASES = [
    ("transpose_2d", lambda a: a.transpose(0, 1), lambda a: a.T, [randn(3, 5)]),
    ("transpose_3d_12", lambda a: a.transpose(1, 2), lambda a: a.swapaxes(1, 2),
     [randn(2, 3, 4)]),
    ("transpose_neg", lambda a: a.transpose(-1, 0), lambda a: a.swapaxes(-1, 0),
     [randn(2, 3, 4)]),
    ("transpose_same", lambda a: a.transpose(1, 1), lambda a: a, [randn(2, 3)]),
    ("swapaxes", lambda a: a.swapaxes(0, 2), lambda a: a.swapaxes(0, 2), [randn(2, 3, 4)]),
    ("sn_transpose", lambda a: sn.transpose(a, 0, 1), lambda a: a.T, [randn(2, 3)]),
    ("permute", lambda a: a.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1), [randn(2, 3, 4)]),
    ("permute_tuple_neg", lambda a: a.permute((-1, 1, 0)), lambda a: a.transpose(2, 1, 0),
     [randn(2, 3, 4)]),
    ("T", lambda a: a.T, lambda a: a.T, [randn(3, 5)]),
    ("t", lambda a: a.t(), lambda a: a.T, [randn(3, 5)]),
    ("t_1d", lambda a: a.t(), lambda a: a, [randn(4)]),
    ("mT", lambda a: a.mT, lambda a: a.swapaxes(-1, -2), [randn(2, 3, 4)]),
    ("view", lambda a: a.view(4, 3), lambda a: a.reshape(4, 3), [randn(2, 6)]),
    ("view_tuple_infer", lambda a: a.view((3, -1)), lambda a: a.reshape(3, -1), [randn(2, 6)]),
    ("view_after_transpose", lambda a: a.transpose(1, 2).view(2, -1),
     lambda a: a.swapaxes(1, 2).reshape(2, -1), [randn(2, 3, 4)]),
    ("contiguous_view", lambda a: a.transpose(1, 2).contiguous().view(2, 4, 3),
     lambda a: a.swapaxes(1, 2).reshape(2, 4, 3), [randn(2, 3, 4)]),
    ("view_as", lambda a, b: a.view_as(b), lambda a, b: a.reshape(b.shape),
     [randn(2, 6), randn(3, 4)]),
    ("reshape", lambda a: a.reshape(-1), lambda a: a.reshape(-1), [randn(2, 3)]),
    ("reshape_0d", lambda a: a.reshape(()), lambda a: a.reshape(()), [randn(1, 1)]),
    ("flatten", lambda a: a.flatten(), lambda a: a.reshape(-1), [randn(2, 3, 4)]),
    ("flatten_1", lambda a: a.flatten(1), lambda a: a.reshape(2, -1), [randn(2, 3, 4)]),
    ("flatten_mid", lambda a: a.flatten(1, 2), lambda a: a.reshape(2, 12, 5),
     [randn(2, 3, 4, 5)]),
    ("flatten_0d", lambda a: a.flatten(), lambda a: a.reshape(1), [randn()]),
    ("unflatten", lambda a: a.unflatten(1, (2, -1)), lambda a: a.reshape(3, 2, 4),
     [randn(3, 8)]),
    ("unsqueeze_0", lambda a: a.unsqueeze(0), lambda a: a[None], [randn(3, 4)]),
    ("unsqueeze_end", lambda a: a.unsqueeze(-1), lambda a: a[..., None], [randn(3, 4)]),
    ("unsqueeze_mid", lambda a: a.unsqueeze(1), lambda a: a[:, None], [randn(3, 4)]),
    ("squeeze_all", lambda a: a.squeeze(), lambda a: a.squeeze(), [randn(1, 3, 1, 2)]),
    ("squeeze_dim", lambda a: a.squeeze(2), lambda a: a.squeeze(2), [randn(1, 3, 1, 2)]),
    ("squeeze_non1_noop", lambda a: a.squeeze(1), lambda a: a, [randn(1, 3, 1, 2)]),
    ("squeeze_tuple", lambda a: a.squeeze((0, 1, -2)), lambda a: a.reshape(3, 2),
     [randn(1, 3, 1, 2)]),
    ("expand", lambda a: a.expand(3, -1, 4), lambda a: np.broadcast_to(a, (3, 2, 4)),
     [randn(1, 2, 1)]),
    ("expand_lead", lambda a: a.expand(2, 3, 4), lambda a: np.broadcast_to(a, (2, 3, 4)),
     [randn(3, 1)]),
    ("expand_as", lambda a, b: a.expand_as(b) * b, lambda a, b: a * b,
     [randn(3, 1), randn(3, 4)]),
    ("repeat", lambda a: a.repeat(2, 3), lambda a: np.tile(a, (2, 3)), [randn(2, 3)]),
    ("repeat_lead", lambda a: a.repeat(2, 1, 2), lambda a: np.tile(a, (2, 1, 2)),
     [randn(2, 3)]),
    ("contiguous", lambda a: a.T.contiguous(), lambda a: np.ascontiguousarray(a.T),
     [randn(3, 4)]),
    ("split_int_first", lambda a: a.split(2, dim=1)[0], lambda a: a[:, :2], [randn(3, 5)]),
    ("split_int_last", lambda a: a.split(2, dim=1)[-1], lambda a: a[:, 4:], [randn(3, 5)]),
    ("split_sections", lambda a: a.split([1, 3], dim=-1)[1], lambda a: a[..., 1:],
     [randn(2, 4)]),
    ("split_sum", lambda a: sum(p.sum() * (i + 1) for i, p in enumerate(a.split(2))),
     lambda a: a[:2].sum() + 2 * a[2:4].sum() + 3 * a[4:].sum(), [randn(5, 2)]),
    ("chunk", lambda a: a.chunk(3)[2], lambda a: a[6:], [randn(7, 2)]),
    ("chunk_dim", lambda a: a.chunk(2, dim=-1)[1], lambda a: a[:, 2:], [randn(3, 4)]),
    ("unbind", lambda a: a.unbind(1)[2], lambda a: a[:, 2], [randn(3, 4)]),
    ("narrow", lambda a: a.narrow(1, 1, 2), lambda a: a[:, 1:3], [randn(3, 4)]),
    ("index_none", lambda a: a[None, :, None, 1], lambda a: a[None, :, None, 1], [randn(3, 4)]),
    ("index_negative", lambda a: a[-1, -3:], lambda a: a[-1, -3:], [randn(3, 4)]),
    ("index_ellipsis", lambda a: a[..., -1], lambda a: a[..., -1], [randn(2, 3, 4)]),
    ("index_mask", lambda a: a[sn.tensor(MASK)], lambda a: a[MASK], [randn(5, 2)]),
    ("index_mask_2d", lambda a: a[sn.tensor(MASK2)], lambda a: a[MASK2], [randn(3, 5)]),
    ("index_mask_dim1", lambda a: a[:, sn.tensor(MASK)], lambda a: a[:, MASK], [randn(3, 5)]),
    ("index_mask_array", lambda a: a[MASK2], lambda a: a[MASK2], [randn(3, 5)]),
    ("index_long_dup", lambda a: a[sn.tensor([2, 0, 2, -1])], lambda a: a[[2, 0, 2, -1]],
     [randn(4, 3)]),
    ("cat", lambda a, b: sn.cat([a, b], dim=1), lambda a, b: np.concatenate([a, b], 1),
     [randn(2, 3), randn(2, 4)]),
    ("cat_neg_tuple", lambda a, b: sn.cat((a, b), -1), lambda a, b: np.concatenate([a, b], -1),
     [randn(2, 3), randn(2, 1)]),
    ("cat_axis_alias", lambda a, b: sn.concatenate([a, b], axis=0),
     lambda a, b: np.concatenate([a, b], 0), [randn(2, 3), randn(1, 3)]),
    ("stack", lambda a, b: sn.stack([a, b]), lambda a, b: np.stack([a, b]),
     [randn(2, 3), randn(2, 3)]),
    ("stack_neg", lambda a, b: sn.stack([a, b], dim=-1), lambda a, b: np.stack([a, b], -1),
     [randn(2, 3), randn(2, 3)]),
    ("tril", lambda a: a.tril(), np.tril, [randn(4, 4)]),
    ("tril_diag", lambda a: sn.tril(a, diagonal=-1), lambda a: np.tril(a, -1), [randn(3, 5)]),
    ("triu", lambda a: a.triu(1), lambda a: np.triu(a, 1), [randn(2, 3, 4)]),
    ("to_double", lambda a: a.to(sn.float64), lambda a: a, [randn(3)]),
    ("double", lambda a: a.double() * 2, lambda a: a * 2, [randn(3)]),
    ("type_as", lambda a, b: a.type_as(b) + b, lambda a, b: a + b, [randn(3), randn(3)]),
]


@pytest.mark.parametrize("name,fn,ref,inputs", CASES, ids=[c[0] for c in CASES])
def test_forward_matches_numpy(name, fn, ref, inputs):
    out = fn(*[sn.tensor(a) for a in inputs])
    want = ref(*inputs)
    assert out.shape == np.shape(want)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,fn,ref,inputs", CASES, ids=[c[0] for c in CASES])
def test_backward_matches_finite_differences(name, fn, ref, inputs):
    gradcheck(fn, *inputs)


# -- the cases where NumPy's meaning of the name is silently wrong -------------------
def test_transpose_swaps_two_dims_hand_values():
    w = sn.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert w.transpose(0, 1).tolist() == [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]
    assert w.transpose(1, 0).tolist() == [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]
    x = sn.arange(24).reshape(2, 3, 4)
    y = x.transpose(1, 2)
    assert y.shape == (2, 4, 3)
    assert y[1, 3, 2].item() == x[1, 2, 3].item() == 23
    assert y[0, 1, 2].item() == 9  # x[0, 2, 1]


def test_transpose_takes_exactly_two_dims():
    x = sn.zeros(2, 3, 4)
    with pytest.raises(TypeError):
        x.transpose(2, 0, 1)  # NumPy's permutation: permute(2, 0, 1) in PyTorch
    with pytest.raises(TypeError):
        x.transpose()


def test_squeeze_dim_that_is_not_one_is_a_noop():
    x = sn.zeros(2, 1, 3)
    assert x.squeeze(0).shape == (2, 1, 3)
    assert x.squeeze(1).shape == (2, 3)
    assert x.squeeze(-1).shape == (2, 1, 3)
    assert sn.zeros(1, 1).squeeze().shape == ()


def test_view_after_transpose_reads_the_transposed_order():
    t = sn.tensor([[1, 2, 3], [4, 5, 6]])
    assert t.t().contiguous().view(-1).tolist() == [1, 4, 2, 5, 3, 6]
    assert t.t().reshape(-1).tolist() == [1, 4, 2, 5, 3, 6]
    assert t.t().view(-1).tolist() == [1, 4, 2, 5, 3, 6]  # PyTorch: needs contiguous()
    assert t.view(3, 2).tolist() == [[1, 2], [3, 4], [5, 6]]


def test_view_shares_memory_when_numpy_can():
    t = sn.zeros(2, 6)
    assert np.shares_memory(t.view(3, 4).array, t.array)
    assert np.shares_memory(t.transpose(0, 1).array, t.array)
    assert not t.T.array.flags.c_contiguous and t.T.contiguous().array.flags.c_contiguous
    assert t.contiguous() is t


def test_split_and_chunk_pieces():
    x = sn.arange(10)
    assert [p.tolist() for p in x.split(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [p.shape for p in x.split([2, 3, 5])] == [(2,), (3,), (5,)]
    assert [p.shape for p in sn.arange(6).chunk(4)] == [(2,), (2,), (2,)]  # 3 pieces, not 4
    assert [p.shape for p in sn.arange(5).chunk(2)] == [(3,), (2,)]
    assert isinstance(x.split(5), tuple)
    with pytest.raises(RuntimeError, match="sum exactly to 10"):
        x.split([3, 3])


def test_qkv_split_view_transpose_like_pytorch():
    """minGPT's attention reshapes, checked against the same NumPy steps."""
    b, t, c, h = 2, 3, 8, 2
    xv = randn(b, t, 3 * c)
    q, k, v = sn.tensor(xv).split(c, dim=2)
    q = q.view(b, t, h, c // h).transpose(1, 2)
    att = (q @ k.view(b, t, h, c // h).transpose(1, 2).transpose(-2, -1))
    qn = xv[..., :c].reshape(b, t, h, c // h).swapaxes(1, 2)
    kn = xv[..., c:2 * c].reshape(b, t, h, c // h).swapaxes(1, 2)
    np.testing.assert_allclose(att.numpy(), qn @ kn.swapaxes(-2, -1), rtol=1e-12)
    vv = v.view(b, t, h, c // h).transpose(1, 2)
    y = (att @ vv).transpose(1, 2).contiguous().view(b, t, c)
    vn = xv[..., 2 * c:].reshape(b, t, h, c // h).swapaxes(1, 2)
    np.testing.assert_allclose(y.numpy(), ((qn @ kn.swapaxes(-2, -1)) @ vn).swapaxes(1, 2)
                               .reshape(b, t, c), rtol=1e-12)


def test_boolean_mask_gradient_lands_on_the_selected_elements():
    x = sn.tensor(np.zeros((3, 5)), requires_grad=True)
    x[sn.tensor(MASK2)].sum().backward()
    np.testing.assert_array_equal(np.asarray(x.grad), MASK2.astype(float))


def test_expand_is_a_broadcast_view_and_repeat_copies():
    a = sn.tensor([[1.0], [2.0]])
    e = a.expand(2, 3)
    assert e.tolist() == [[1.0] * 3, [2.0] * 3]
    assert np.shares_memory(e.array, a.array)
    assert a.repeat(1, 2).tolist() == [[1.0, 1.0], [2.0, 2.0]]
    assert a.repeat(2, 1).tolist() == [[1.0], [2.0], [1.0], [2.0]]  # not np.repeat's order


def test_T_on_other_ranks_reverses_with_pytorch_warning():
    x = sn.zeros(2, 3, 4)
    with pytest.warns(UserWarning, match="deprecated"):
        assert x.T.shape == (4, 3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sn.zeros(2, 3).T.shape == (3, 2)
        assert sn.tensor(1.0).T.shape == ()
    with pytest.raises(RuntimeError):
        _ = sn.zeros(3).mT
    with pytest.raises(RuntimeError):
        x.t()


def test_tril_triu_hand_values():
    m = sn.ones(3, 3)
    assert m.tril().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert m.triu(1).tolist() == [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert sn.tril(sn.ones(2, 2, dtype=sn.bool)).dtype == np.bool_
    with pytest.raises(RuntimeError):
        sn.ones(3).tril()


ERRORS = [
    ("transpose_dim", lambda x: x.transpose(0, 3), IndexError),
    ("permute_len", lambda x: x.permute(1, 0), RuntimeError),
    ("permute_dup", lambda x: x.permute(0, 0, 1), RuntimeError),
    ("view_size", lambda x: x.view(5, 5), RuntimeError),
    ("view_two_holes", lambda x: x.view(-1, -1), RuntimeError),
    ("reshape_size", lambda x: x.reshape(7), RuntimeError),
    ("unsqueeze_dim", lambda x: x.unsqueeze(4), IndexError),
    ("squeeze_dim", lambda x: x.squeeze(3), IndexError),
    ("flatten_order", lambda x: x.flatten(2, 1), RuntimeError),
    ("expand_non1", lambda x: x.expand(2, 5, 4), RuntimeError),
    ("expand_short", lambda x: x.expand(4), RuntimeError),
    ("repeat_short", lambda x: x.repeat(2), RuntimeError),
    ("cat_sizes", lambda x: sn.cat([x, sn.zeros(2, 4, 4)], dim=2), RuntimeError),
    ("cat_empty", lambda x: sn.cat([]), RuntimeError),
    ("stack_sizes", lambda x: sn.stack([x, sn.zeros(2, 3, 5)]), RuntimeError),
    ("size_dim", lambda x: x.size(3), IndexError),
    ("chunk_zero", lambda x: x.chunk(0), RuntimeError),
]


@pytest.mark.parametrize("name,fn,exc", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_have_pytorchs_types(name, fn, exc):
    with pytest.raises(exc):
        fn(sn.zeros(2, 3, 4))


def test_size_numel_dim():
    x = sn.zeros(2, 3, 4)
    assert x.size() == (2, 3, 4) == x.shape
    assert (x.size(0), x.size(-1), x.size(1)) == (2, 4, 3)
    assert x.numel() == 24 and x.nelement() == 24 and x.dim() == 3 == x.ndim
    assert sn.tensor(3.0).size() == () and sn.tensor(3.0).numel() == 1
    b, t, c = x.size()
    assert (b, t, c) == (2, 3, 4)


def _run(fn, inputs, device):
    """fn's output and its inputs' gradients (weighted sum), as host arrays."""
    ts = [sn.tensor(a, device=device, requires_grad=True) for a in inputs]
    out = fn(*ts)
    weights = np.linspace(-1, 1, out.numel()).reshape(out.shape)
    (out * sn.tensor(weights, device=device)).sum().backward()
    grads = [t.grad.numpy() if isinstance(t.grad, sn.Tensor) else asnumpy(t.grad)
             for t in ts if t.grad is not None]
    return [out.numpy()] + grads


@pytest.mark.gpu
@pytest.mark.parametrize("name,fn,ref,inputs", CASES, ids=[c[0] for c in CASES])
def test_gpu_matches_host(name, fn, ref, inputs):
    for got, want in zip(_run(fn, inputs, "gpu"), _run(fn, inputs, "cpu"), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
