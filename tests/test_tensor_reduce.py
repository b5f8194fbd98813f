"""Reductions and sorting with PyTorch's names and semantics: every method's
forward against a plain NumPy expression and its backward against float64
central finite differences; values pinned from PyTorch's documentation where
a NumPy expression could share a misreading (var's default correction, the
(values, indices) pairs, gradients on ties)."""
import math

import numpy as np
import pytest

import spmdnet as sn
from tests.helpers.op_tables import check_row

rng = np.random.default_rng(14)


def randn(*shape):
    return rng.standard_normal(shape)


def away_from_zero(*shape):
    return np.sign(randn(*shape)) * (np.abs(randn(*shape)) + 0.5)


def distinct(*shape):
    """Values with no ties (max/sort gradients are then unambiguous)."""
    return rng.permutation(np.arange(math.prod(shape), dtype=float)).reshape(shape) * 0.1


def np_logsumexp(x, axis=None, keepdims=False):
    m = x.max(axis=axis, keepdims=True)
    out = np.log(np.exp(x - m).sum(axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


# name, tensor function, numpy reference, inputs; all differentiable
CASES = [
    ("sum_all", lambda a: a.sum(), np.sum, [randn(3, 4)]),
    ("sum_dim", lambda a: a.sum(1), lambda a: a.sum(1), [randn(3, 4, 2)]),
    ("sum_dims_keepdim", lambda a: a.sum(dim=(0, 2), keepdim=True),
     lambda a: a.sum((0, 2), keepdims=True), [randn(3, 4, 2)]),
    ("sum_axis_alias", lambda a: a.sum(axis=-1, keepdims=True),
     lambda a: a.sum(-1, keepdims=True), [randn(3, 4)]),
    ("sum_free", lambda a: sn.sum(a, dim=0), lambda a: a.sum(0), [randn(3, 4)]),
    ("mean_dim", lambda a: a.mean(-1), lambda a: a.mean(-1), [randn(3, 5)]),
    ("mean_dims", lambda a: a.mean((0, 1), keepdim=True),
     lambda a: a.mean((0, 1), keepdims=True), [randn(2, 3, 4)]),
    ("var_default", lambda a: a.var(), lambda a: a.var(ddof=1), [randn(4, 5)]),
    ("var_dim", lambda a: a.var(1), lambda a: a.var(1, ddof=1), [randn(4, 5)]),
    ("var_unbiased_false", lambda a: a.var(1, unbiased=False, keepdim=True),
     lambda a: a.var(1, keepdims=True), [randn(4, 5)]),
    ("var_legacy_positional", lambda a: a.var(0, False), lambda a: a.var(0), [randn(4, 5)]),
    ("var_correction2", lambda a: a.var(dim=(0, 1), correction=2),
     lambda a: a.var((0, 1), ddof=2), [randn(3, 4, 2)]),
    ("std_default", lambda a: a.std(), lambda a: a.std(ddof=1), [randn(4, 5)]),
    ("std_dim", lambda a: a.std(dim=0, correction=0), lambda a: a.std(0), [randn(4, 5)]),
    ("prod_all", lambda a: a.prod(), np.prod, [randn(2, 3)]),
    ("prod_dim", lambda a: a.prod(1), lambda a: a.prod(1), [randn(3, 4)]),
    ("prod_with_zeros", lambda a: a.prod(1, keepdim=True), lambda a: a.prod(1, keepdims=True),
     [np.array([[0.0, 2.0, 3.0], [0.0, 0.0, 2.0], [1.5, -2.0, 0.5]])]),
    ("amax_dims", lambda a: a.amax((0, 2)), lambda a: a.max((0, 2)), [distinct(3, 4, 2)]),
    ("amin_keepdim", lambda a: a.amin(1, keepdim=True), lambda a: a.min(1, keepdims=True),
     [distinct(3, 4)]),
    ("max_all", lambda a: a.max(), np.max, [distinct(3, 4)]),
    ("min_all", lambda a: a.min(), np.min, [distinct(3, 4)]),
    ("max_dim_values", lambda a: a.max(1).values, lambda a: a.max(1), [distinct(3, 4)]),
    ("max_dim_keepdim", lambda a: a.max(dim=0, keepdim=True)[0],
     lambda a: a.max(0, keepdims=True), [distinct(3, 4)]),
    ("min_axis_alias", lambda a: a.min(axis=-1).values, lambda a: a.min(-1), [distinct(2, 3, 4)]),
    ("logsumexp_dim", lambda a: a.logsumexp(1), lambda a: np_logsumexp(a, 1), [randn(3, 4) * 5]),
    ("logsumexp_keepdim", lambda a: sn.logsumexp(a, dim=(0, 1), keepdim=True),
     lambda a: np_logsumexp(a, (0, 1), True), [randn(3, 4)]),
    ("norm_all", lambda a: a.norm(), np.linalg.norm, [randn(3, 4)]),
    ("norm_p1_dim", lambda a: a.norm(p=1, dim=1), lambda a: np.abs(a).sum(1),
     [away_from_zero(3, 4)]),
    ("norm_p3", lambda a: a.norm(3, dim=0, keepdim=True),
     lambda a: (np.abs(a) ** 3).sum(0, keepdims=True) ** (1 / 3), [away_from_zero(3, 4)]),
    ("norm_fro_dims", lambda a: a.norm("fro", dim=(1, 2)),
     lambda a: np.sqrt((a * a).sum((1, 2))), [randn(2, 3, 4)]),
    ("norm_inf", lambda a: a.norm(float("inf"), dim=1), lambda a: np.abs(a).max(1),
     [distinct(3, 4) - 0.55]),
    ("topk_values", lambda a: a.topk(2).values, lambda a: -np.sort(-a, -1)[..., :2],
     [distinct(3, 5)]),
    ("topk_smallest_dim0", lambda a: a.topk(3, dim=0, largest=False)[0],
     lambda a: np.sort(a, 0)[:3], [distinct(4, 3)]),
    ("sort_values", lambda a: a.sort().values, lambda a: np.sort(a, -1), [distinct(3, 4)]),
    ("sort_descending_dim0", lambda a: a.sort(dim=0, descending=True)[0],
     lambda a: -np.sort(-a, 0), [distinct(4, 3)]),
]


@pytest.mark.parametrize("name,fn,ref,inputs", CASES, ids=[c[0] for c in CASES])
def test_forward_and_backward(name, fn, ref, inputs):
    check_row(fn, ref, inputs)


X = np.array([[1.0, 5.0, 5.0, 2.0], [7.0, 0.0, 3.0, 7.0]])

# name, function, expected value (hand-computed from PyTorch's documentation)
INDEX_CASES = [
    ("argmax_all", lambda t: t.argmax(), 4),
    ("argmax_dim_first_tie", lambda t: t.argmax(1), [1, 0]),
    ("argmin_dim_keepdim", lambda t: t.argmin(dim=1, keepdim=True), [[0], [1]]),
    ("argmax_axis_alias", lambda t: t.argmax(axis=0), [1, 0, 0, 1]),
    ("max_dim_indices", lambda t: t.max(1).indices, [1, 0]),
    ("min_dim_indices", lambda t: t.min(0)[1], [0, 1, 1, 0]),
    ("sort_indices", lambda t: t.sort(1).indices, [[0, 3, 1, 2], [1, 2, 0, 3]]),
    ("sort_indices_stable_descending",
     lambda t: t.sort(1, descending=True, stable=True).indices, [[1, 2, 3, 0], [0, 3, 2, 1]]),
    ("topk_indices", lambda t: t.topk(1, dim=0).indices, [[1, 0, 0, 1]]),
    ("argsort", lambda t: sn.argsort(t[0], stable=True), [0, 3, 1, 2]),
]


@pytest.mark.parametrize("name,fn,expected", INDEX_CASES, ids=[c[0] for c in INDEX_CASES])
def test_indices_are_int64_and_pytorchs(name, fn, expected):
    out = fn(sn.tensor(X))
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out.numpy(), expected)


def test_var_default_correction_is_one():
    # PyTorch's docs: var/std use Bessel's correction unless told otherwise
    t = sn.tensor([1.0, 2.0, 3.0, 4.0])
    assert t.var().item() == pytest.approx(5 / 3)
    assert t.var(unbiased=False).item() == pytest.approx(1.25)
    assert t.var(correction=0).item() == pytest.approx(1.25)
    assert t.std().item() == pytest.approx(math.sqrt(5 / 3))
    assert math.isnan(sn.tensor([3.0]).var().item())  # N - 1 = 0


def test_max_with_dim_is_a_named_pair():
    t = sn.tensor(X)
    for out in (t.max(1), t.max(dim=1), t.max(axis=1), sn.max(t, 1)):
        assert type(out).__name__ == "max" and out._fields == ("values", "indices")
        values, indices = out
        np.testing.assert_array_equal(values.numpy(), [5.0, 7.0])
        np.testing.assert_array_equal(indices.numpy(), [1, 0])
    assert t.max(1, keepdim=True).values.shape == (2, 1)
    assert t.max(-1, keepdims=True).indices.shape == (2, 1)
    assert type(t.min(0)).__name__ == "min"
    assert isinstance(t.max(), sn.Tensor) and t.max().item() == 7.0
    np.testing.assert_array_equal(t.max(sn.tensor(np.full(4, 4.0))).numpy(),
                                  np.maximum(X, 4.0))  # torch.max(a, b)


@pytest.mark.parametrize("fn", [lambda t: t.max((0, 1)), lambda t: t.min(dim=(1,)),
                                lambda t: t.argmax((0, 1))])
def test_tuple_dims_belong_to_amax(fn):
    with pytest.raises(TypeError, match="one int dim"):
        fn(sn.tensor(X))


@pytest.mark.parametrize("name,fn,expected", [
    # max(dim): the whole gradient to the returned (first) index
    ("max_dim", lambda t: t.max(1).values, [[0, 1, 0, 0], [1, 0, 0, 0]]),
    ("min_dim", lambda t: t.min(1)[0], [[1, 0, 0, 0], [0, 1, 0, 0]]),
    # max() and amax/amin: split evenly among the tied elements
    ("max_all", lambda t: t.max(), [[0, 0, 0, 0], [0.5, 0, 0, 0.5]]),
    ("amax_dim", lambda t: t.amax(1), [[0, 0.5, 0.5, 0], [0.5, 0, 0, 0.5]]),
    ("amin_all", lambda t: sn.amin(t), [[0, 0, 0, 0], [0, 1, 0, 0]]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_gradients_on_ties_as_pytorch(name, fn, expected):
    t = sn.tensor(X, requires_grad=True)
    fn(t).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy() if hasattr(t.grad, "numpy") else t.grad,
                                  expected)


def test_norm_gradient_at_zero_is_zero():
    t = sn.tensor(np.zeros((2, 3)), requires_grad=True)
    t.norm(dim=1).sum().backward()
    np.testing.assert_array_equal(np.asarray(t.grad), np.zeros((2, 3)))


def test_sort_puts_nan_last_and_first_descending():
    t = sn.tensor([2.0, float("nan"), 1.0])
    assert t.sort().indices.tolist() == [2, 0, 1]
    assert t.sort(descending=True).indices.tolist() == [1, 0, 2]
    assert math.isnan(t.max().item())


@pytest.mark.parametrize("name,fn,expected", [
    ("any", lambda t: t.any(), True),
    ("all", lambda t: t.all(), False),
    ("any_dim", lambda t: t.any(1), [True, False]),
    ("all_dim_keepdim", lambda t: t.all(dim=0, keepdim=True), [[False, False]]),
    ("any_axis", lambda t: sn.any(t, axis=0), [True, False]),
])
def test_any_all(name, fn, expected):
    out = fn(sn.tensor(np.array([[True, False], [False, False]])))
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out.numpy(), expected)


def test_reduction_dtypes_as_pytorch():
    ints = sn.tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert ints.sum().dtype == np.int64 and ints.prod(1).dtype == np.int64
    assert ints.sum(dtype=np.float32).dtype == np.float32
    assert ints.mean(dtype=np.float64).item() == 2.5
    with pytest.raises(RuntimeError, match="floating point"):
        ints.mean()
    f32 = sn.tensor(np.ones((2, 3), np.float32))
    for out in (f32.sum(0), f32.mean(), f32.var(1), f32.std(), f32.amax(), f32.logsumexp(1),
                f32.norm(), f32.max(1).values, f32.topk(2).values):
        assert out.dtype == np.float32


def test_empty_reductions_raise():
    empty = sn.tensor(np.zeros((0, 3)))
    with pytest.raises(IndexError):
        empty.max(0)
    with pytest.raises(IndexError):
        empty.amax()
    assert empty.sum().item() == 0.0 and empty.amax(1).shape == (0,)


def test_topk_k_out_of_range_raises():
    with pytest.raises(RuntimeError, match="out of range"):
        sn.tensor(X).topk(5)
