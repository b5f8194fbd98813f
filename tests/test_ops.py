"""Every op: forward against a plain NumPy expression, backward against
float64 central finite differences, over several shapes with broadcasting."""
import math

import numpy as np
import pytest
from spmdnet.autograd import gradcheck

import spmdnet as sn
import spmdnet.functional as F

rng = np.random.default_rng(1234)


def randn(*shape):
    return rng.standard_normal(shape)


def positive(*shape):
    return np.abs(rng.standard_normal(shape)) + 0.5


def np_log_softmax(x, axis):
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


def np_gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def np_layer_norm(x, w=None, b=None, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    out = (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return out if w is None else out * w + b


LABELS = np.array([2, 0, 1, 2, 2])
EMB_IDX = np.array([[0, 3, 3], [1, 0, 4]])

# name, tensor function, numpy reference, inputs
CASES = [
    ("add", lambda a, b: a + b, lambda a, b: a + b, [randn(3, 4), randn(4)]),
    ("add_bcast", lambda a, b: a + b, lambda a, b: a + b, [randn(2, 1, 3), randn(4, 3)]),
    ("add_scalar", lambda a: 2.5 + a, lambda a: 2.5 + a, [randn(3)]),
    ("sub", lambda a, b: a - b, lambda a, b: a - b, [randn(5, 1), randn(1, 7)]),
    ("rsub", lambda a: 1.0 - a, lambda a: 1.0 - a, [randn(4)]),
    ("mul", lambda a, b: a * b, lambda a, b: a * b, [randn(3, 5), randn(5)]),
    ("div", lambda a, b: a / b, lambda a, b: a / b, [randn(2, 3), positive(2, 1)]),
    ("rdiv", lambda a: 2.0 / a, lambda a: 2.0 / a, [positive(3)]),
    ("neg", lambda a: -a, lambda a: -a, [randn(3, 3)]),
    ("pow_scalar", lambda a: a ** 3, lambda a: a ** 3, [randn(7)]),
    ("pow_tensor", lambda a, b: a ** b, lambda a, b: a ** b, [positive(3, 2), randn(2)]),
    ("matmul", lambda a, b: a @ b, lambda a, b: a @ b, [randn(3, 4), randn(4, 5)]),
    ("matmul_batched", lambda a, b: a @ b, lambda a, b: a @ b, [randn(2, 3, 4), randn(4, 5)]),
    ("matmul_batch_bcast", lambda a, b: a @ b, lambda a, b: a @ b,
     [randn(1, 3, 4), randn(2, 4, 5)]),
    ("matmul_vec_mat", lambda a, b: a @ b, lambda a, b: a @ b, [randn(4), randn(4, 3)]),
    ("matmul_mat_vec", lambda a, b: a @ b, lambda a, b: a @ b, [randn(3, 4), randn(4)]),
    ("linear", F.linear, lambda x, w, b: x @ w.T + b, [randn(5, 3), randn(4, 3), randn(4)]),
    ("linear_nobias", F.linear, lambda x, w: x @ w.T, [randn(2, 5, 3), randn(4, 3)]),
    ("exp", lambda a: a.exp(), np.exp, [randn(3, 4)]),
    ("log", lambda a: a.log(), np.log, [positive(3, 4)]),
    ("sqrt", lambda a: a.sqrt(), np.sqrt, [positive(5)]),
    ("tanh", lambda a: a.tanh(), np.tanh, [randn(3, 4)]),
    ("sigmoid", lambda a: a.sigmoid(), lambda a: 1 / (1 + np.exp(-a)), [randn(3, 4)]),
    ("relu", lambda a: a.relu(), lambda a: np.maximum(a, 0), [randn(4, 5)]),
    ("gelu", F.gelu, np_gelu, [randn(3, 5) * 2]),
    ("gelu_tanh", lambda a: F.gelu(a, approximate="tanh"),
     lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))),
     [randn(3, 5) * 2]),
    ("sum_all", lambda a: a.sum(), np.sum, [randn(3, 4)]),
    ("sum_axis", lambda a: a.sum(axis=1), lambda a: a.sum(axis=1), [randn(3, 4, 2)]),
    ("sum_axes_keep", lambda a: a.sum(axis=(0, 2), keepdims=True),
     lambda a: a.sum(axis=(0, 2), keepdims=True), [randn(3, 4, 2)]),
    ("mean", lambda a: a.mean(axis=-1), lambda a: a.mean(axis=-1), [randn(3, 5)]),
    ("mean_all_keep", lambda a: a.mean(keepdims=True), lambda a: a.mean(keepdims=True),
     [randn(2, 3)]),
    ("max_all", lambda a: a.max(), np.max, [randn(4, 3)]),
    ("max_axis", lambda a: a.max(axis=0).values, lambda a: a.max(axis=0), [randn(4, 3)]),
    ("max_keep", lambda a: a.amax(axis=(1,), keepdims=True),
     lambda a: a.max(axis=1, keepdims=True), [randn(2, 5, 3)]),
    ("reshape", lambda a: a.reshape(4, 3) * 1.0, lambda a: a.reshape(4, 3), [randn(2, 6)]),
    ("reshape_tuple", lambda a: a.reshape((3, -1)), lambda a: a.reshape(3, -1), [randn(2, 6)]),
    ("permute", lambda a: a.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1),
     [randn(2, 3, 4)]),
    ("T", lambda a: a.T, lambda a: a.T, [randn(3, 5)]),
    ("index_basic", lambda a: a[1:3, ::2], lambda a: a[1:3, ::2], [randn(4, 5)]),
    ("index_int", lambda a: a[1], lambda a: a[1], [randn(4, 5)]),
    ("index_newaxis", lambda a: a[None, :, 2], lambda a: a[None, :, 2], [randn(4, 5)]),
    ("index_array_dup", lambda a: a[np.array([0, 2, 0, 0])], lambda a: a[[0, 2, 0, 0]],
     [randn(3, 2)]),
    ("index_arrays", lambda a: a[np.array([0, 1, 1]), np.array([2, 0, 2])],
     lambda a: a[[0, 1, 1], [2, 0, 2]], [randn(2, 3)]),
    ("concatenate", lambda a, b: F.concatenate([a, b], axis=1),
     lambda a, b: np.concatenate([a, b], axis=1), [randn(2, 3), randn(2, 4)]),
    ("stack", lambda a, b, c: F.stack([a, b, c], axis=1),
     lambda a, b, c: np.stack([a, b, c], axis=1), [randn(2, 3), randn(2, 3), randn(2, 3)]),
    ("softmax", lambda x: F.softmax(x, dim=-1), lambda x: np.exp(np_log_softmax(x, -1)),
     [randn(3, 5)]),
    ("softmax_axis0", lambda x: F.softmax(x, axis=0),
     lambda x: np.exp(np_log_softmax(x, 0)), [randn(3, 5)]),
    ("log_softmax", lambda x: F.log_softmax(x, -1), lambda x: np_log_softmax(x, -1), [randn(4, 6)]),
    ("cross_entropy", lambda x: F.cross_entropy(x, LABELS),
     lambda x: -np_log_softmax(x, 1)[np.arange(5), LABELS].mean(), [randn(5, 3)]),
    ("cross_entropy_sum", lambda x: F.cross_entropy(x, LABELS, reduction="sum"),
     lambda x: -np_log_softmax(x, 1)[np.arange(5), LABELS].sum(), [randn(5, 3)]),
    ("cross_entropy_none", lambda x: F.cross_entropy(x, LABELS, reduction="none"),
     lambda x: -np_log_softmax(x, 1)[np.arange(5), LABELS], [randn(5, 3)]),
    ("mse_loss", F.mse_loss, lambda a, b: ((a - b) ** 2).mean(), [randn(3, 4), randn(3, 4)]),
    ("mse_loss_sum", lambda a, b: F.mse_loss(a, b, reduction="sum"),
     lambda a, b: ((a - b) ** 2).sum(), [randn(5), randn(5)]),
    ("layer_norm", lambda x: F.layer_norm(x, 6), np_layer_norm, [randn(3, 6)]),
    ("layer_norm_affine", lambda x, w, b: F.layer_norm(x, (5,), w, b), np_layer_norm,
     [randn(2, 3, 5), randn(5), randn(5)]),
    ("embedding", lambda w: F.embedding(EMB_IDX, w), lambda w: w[EMB_IDX], [randn(5, 3)]),
]


@pytest.mark.parametrize("name,fn,ref,inputs", CASES, ids=[c[0] for c in CASES])
def test_forward_matches_numpy(name, fn, ref, inputs):
    out = fn(*[sn.Tensor(a) for a in inputs])
    np.testing.assert_allclose(out.numpy(), ref(*inputs), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,fn,ref,inputs", CASES, ids=[c[0] for c in CASES])
def test_backward_matches_finite_differences(name, fn, ref, inputs):
    gradcheck(fn, *inputs)


def test_float32_stays_float32():
    a = sn.tensor(np.ones((2, 3), np.float32), requires_grad=True)
    out = (a * 2.5 + 1) / 3.0 - a ** 2
    assert out.dtype == np.float32
    out.sum().backward()
    assert a.grad.dtype == np.float32


def test_dropout_forward_and_backward_use_one_mask():
    x = np.ones((50, 40))
    sn.manual_seed(3)
    t = sn.Tensor(x.copy(), requires_grad=True)
    out = F.dropout(t, p=0.25)
    kept = out.numpy() != 0
    assert set(np.unique(out.numpy())) <= {0.0, 1 / 0.75}
    assert abs(kept.mean() - 0.75) < 0.03
    out.sum().backward()
    np.testing.assert_array_equal(t.grad, kept / 0.75)


def test_dropout_gradcheck_with_fixed_seed():
    def fn(x):
        sn.manual_seed(7)  # the same mask for every evaluation
        return F.dropout(x, p=0.5)
    gradcheck(fn, randn(4, 6))


def test_dropout_identity_when_not_training():
    x = sn.Tensor(randn(3, 3))
    assert F.dropout(x, 0.5, training=False) is x


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
def test_softmax_is_stable_for_large_logits(fn):
    out = fn(sn.Tensor(np.array([[1000.0, 1001.0, -1000.0]])), -1).numpy()
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, fn(sn.Tensor(np.array([[0.0, 1.0, -2000.0]])), -1).numpy())


def test_cross_entropy_is_stable_for_large_logits():
    logits = sn.Tensor(np.array([[1e4, 0.0], [0.0, 1e4]]), requires_grad=True)
    loss = F.cross_entropy(logits, np.array([0, 0]))
    assert np.isclose(loss.item(), 1e4 / 2)
    loss.backward()
    # softmax of row 2 is [0, 1], label 0: (p - onehot) / N = [-0.5, 0.5]
    np.testing.assert_allclose(logits.grad, [[0.0, 0.0], [-0.5, 0.5]])


def test_max_ties_share_the_gradient():
    a = sn.Tensor(np.array([1.0, 3.0, 3.0]), requires_grad=True)
    a.max().backward()
    np.testing.assert_array_equal(a.grad, [0.0, 0.5, 0.5])


def test_comparisons_have_no_graph():
    a = sn.Tensor(randn(4), requires_grad=True)
    mask = a > 0
    assert mask.dtype == bool and not mask.requires_grad
    np.testing.assert_array_equal(mask.numpy(), a.numpy() > 0)


class BrokenExp(sn.Function):
    """exp with a deliberately wrong derivative (2·exp)."""

    def forward(self, a):
        self.out = np.exp(a)
        return self.out

    def backward(self, g):
        return 2 * g * self.out


def test_gradcheck_catches_a_wrong_backward():
    with pytest.raises(AssertionError):
        gradcheck(BrokenExp.apply, randn(3))
    gradcheck(lambda a: a.exp(), randn(3))  # the right one passes
