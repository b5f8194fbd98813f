"""Elementwise functions, comparisons, selection, einsum/bmm and PyTorch's
type promotion: forward against a plain NumPy expression, backward against
float64 central finite differences, and hand-computed values from PyTorch's
documentation for ties, bounds and result dtypes."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn
from tests.helpers.op_tables import check_row
from tests.helpers.oracles import default_dtype

rng = np.random.default_rng(41)


def randn(*shape):
    return rng.standard_normal(shape)


def positive(*shape):
    return np.abs(randn(*shape)) + 0.5


def away(*shape, frm=0.0):
    """Values at least 0.1 from ``frm`` (no kink under the finite differences)."""
    x = randn(*shape)
    return np.where(np.abs(x - frm) < 0.1, x + 0.3, x)


MASK = np.array([[True, False, True], [False, False, True]])

# name, tensor function, numpy reference, inputs; all differentiable
CASES = [
    ("abs", lambda a: a.abs(), np.abs, [away(3, 4)]),
    ("abs_builtin", abs, np.abs, [away(5)]),
    ("clamp", lambda a: a.clamp(-0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5),
     [away(4, 5, frm=0.5) * 0 + np.linspace(-2.05, 2.05, 20).reshape(4, 5)]),
    ("clamp_min_only", lambda a: a.clamp(min=0.1), lambda a: np.maximum(a, 0.1),
     [away(3, 4, frm=0.1)]),
    ("clip_max_only", lambda a: a.clip(max=-0.2), lambda a: np.minimum(a, -0.2),
     [away(3, 4, frm=-0.2)]),
    ("clamp_tensor_bounds", lambda a, lo: sn.clamp(a, min=lo, max=lo + 1.0),
     lambda a, lo: np.clip(a, lo, lo + 1), [np.linspace(-2.05, 2.05, 12).reshape(3, 4),
                                            np.array([-0.5, 0.35, 0.15, -1.5])]),
    ("rsqrt", lambda a: a.rsqrt(), lambda a: 1 / np.sqrt(a), [positive(3, 4)]),
    ("sqrt", lambda a: a.sqrt(), np.sqrt, [positive(3, 4)]),
    ("exp", lambda a: sn.exp(a), np.exp, [randn(3, 4)]),
    ("log", lambda a: a.log(), np.log, [positive(4)]),
    ("log1p", lambda a: a.log1p(), np.log1p, [positive(3, 2) - 0.4]),
    ("sin", lambda a: a.sin(), np.sin, [randn(3, 4)]),
    ("cos", lambda a: sn.cos(a), np.cos, [randn(3, 4)]),
    ("maximum", lambda a, b: a.maximum(b), np.maximum, [randn(3, 4), randn(4)]),
    ("minimum_free", lambda a, b: sn.minimum(a, b), np.minimum, [randn(2, 1, 3), randn(4, 3)]),
    ("where", lambda a, b: sn.where(sn.tensor(MASK), a, b), lambda a, b: np.where(MASK, a, b),
     [randn(2, 3), randn(3)]),
    ("where_scalar", lambda a: sn.where(sn.tensor(MASK), a, 0.0),
     lambda a: np.where(MASK, a, 0.0), [randn(2, 3)]),
    ("where_method", lambda a, b: a.where(sn.tensor(MASK), b), lambda a, b: np.where(MASK, a, b),
     [randn(2, 3), randn(2, 3)]),
    ("masked_fill", lambda a: a.masked_fill(sn.tensor(MASK), -10.0),
     lambda a: np.where(MASK, -10.0, a), [randn(2, 3)]),
    ("masked_fill_bcast", lambda a: a.masked_fill(sn.tensor(MASK[0]), float("-inf")).exp(),
     lambda a: np.exp(np.where(MASK[0], -np.inf, a)), [randn(2, 3)]),
    ("matmul_free", sn.matmul, np.matmul, [randn(3, 4), randn(4, 2)]),
    ("matmul_vec_vec", sn.matmul, np.matmul, [randn(4), randn(4)]),
    ("matmul_vec_batch", sn.matmul, np.matmul, [randn(4), randn(2, 4, 3)]),
    ("matmul_batch_vec", lambda a, b: a @ b, np.matmul, [randn(2, 3, 4), randn(4)]),
    ("bmm", sn.bmm, np.matmul, [randn(2, 3, 4), randn(2, 4, 5)]),
    ("einsum_mm", lambda a, b: sn.einsum("ij,jk->ik", a, b), lambda a, b: a @ b,
     [randn(3, 4), randn(4, 2)]),
    ("einsum_implicit", lambda a, b: sn.einsum("ij,jk", a, b), lambda a, b: a @ b,
     [randn(3, 4), randn(4, 2)]),
    ("einsum_list", lambda a, b: sn.einsum("bij,bjk->bik", [a, b]), np.matmul,
     [randn(2, 3, 4), randn(2, 4, 2)]),
    ("einsum_attention", lambda q, k: sn.einsum("bhqd,bhkd->bhqk", q, k),
     lambda q, k: q @ k.swapaxes(-1, -2), [randn(2, 2, 3, 4), randn(2, 2, 5, 4)]),
    ("einsum_sum_only_here", lambda a, b: sn.einsum("ij,k->k", a, b),
     lambda a, b: a.sum() * b, [randn(2, 3), randn(4)]),
    ("einsum_outer", lambda a, b: sn.einsum("i,j->ij", a, b), np.outer, [randn(3), randn(4)]),
    ("einsum_ellipsis_bcast", lambda a, b: sn.einsum("...ij,...jk->...ik", a, b), np.matmul,
     [randn(2, 1, 3, 4), randn(5, 4, 2)]),
    ("einsum_size1_bcast", lambda a, b: sn.einsum("bij,bjk->bik", a, b), np.matmul,
     [randn(1, 3, 4), randn(2, 4, 2)]),
    ("einsum_transpose", lambda a: sn.einsum("ijk->kji", a), lambda a: a.transpose(2, 1, 0),
     [randn(2, 3, 4)]),
]


@pytest.mark.parametrize("name,fn,ref,inputs", CASES, ids=[c[0] for c in CASES])
def test_forward_and_backward(name, fn, ref, inputs):
    check_row(fn, ref, inputs)


def _grad(t):
    return np.asarray(t.grad.array)


@pytest.mark.parametrize("name,fn,x,expected", [
    # clamp: the gradient passes where min <= x <= max (bounds included)
    ("clamp_bounds", lambda t: t.clamp(0.0, 2.0), [-1.0, 0.0, 1.0, 2.0, 3.0], [0, 1, 1, 1, 0]),
    ("clamp_min_gt_max", lambda t: t.clamp(2.0, 1.0), [0.0, 1.5, 3.0], [0, 0, 0]),
    # maximum / minimum: ties split the gradient evenly
    ("maximum_ties", lambda t: t.maximum(sn.tensor([1.0, 1.0, 1.0])), [0.0, 1.0, 2.0],
     [0, 0.5, 1]),
    ("minimum_ties", lambda t: sn.minimum(t, 1.0), [0.0, 1.0, 2.0], [1, 0.5, 0]),
    ("abs_at_zero", lambda t: t.abs(), [-2.0, 0.0, 3.0], [-1, 0, 1]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_gradients_pinned(name, fn, x, expected):
    t = sn.tensor(x, requires_grad=True)
    fn(t).sum().backward()
    np.testing.assert_array_equal(_grad(t), expected)


def test_clamp_values_pinned():
    t = sn.tensor([-1.0, 0.5, 3.0])
    np.testing.assert_array_equal(t.clamp(2.0, 1.0).numpy(), [1.0, 1.0, 1.0])  # min > max: max
    with pytest.raises(RuntimeError, match="min"):
        t.clamp()


A = np.array([1.0, 2.0, 3.0])
B = np.array([3.0, 2.0, 1.0])

# name, function of tensors a, b, numpy reference
BOOL_CASES = [
    ("eq", lambda a, b: a == b, A == B), ("ne", lambda a, b: a != b, A != B),
    ("lt", lambda a, b: a < b, A < B), ("le", lambda a, b: a <= b, A <= B),
    ("gt", lambda a, b: a > b, A > B), ("ge", lambda a, b: a >= b, A >= B),
    ("eq_method", lambda a, b: a.eq(b), A == B), ("ne_method", lambda a, b: a.ne(2.0), A != 2),
    ("lt_method", lambda a, b: a.lt(b), A < B), ("le_method", lambda a, b: a.le(2), A <= 2),
    ("gt_method", lambda a, b: a.gt(b), A > B), ("ge_method", lambda a, b: a.ge(b), A >= B),
    ("and", lambda a, b: (a > 1) & (b > 1), (A > 1) & (B > 1)),
    ("or", lambda a, b: (a > 2) | (b > 2), (A > 2) | (B > 2)),
    ("xor", lambda a, b: (a > 1) ^ (b > 1), (A > 1) ^ (B > 1)),
    ("invert", lambda a, b: ~(a > 1), ~(A > 1)),
    ("rand_python_bool", lambda a, b: True & (a > 1), A > 1),
    ("logical_not", lambda a, b: sn.logical_not(a > 1), ~(A > 1)),
    ("isfinite", lambda a, b: sn.isfinite(a / (b - 2)), np.array([True, False, True])),
    ("isnan", lambda a, b: ((a - 2) / (b - 2)).isnan(), np.array([False, True, False])),
    ("isinf", lambda a, b: (a / (b - 2)).isinf(), np.array([False, True, False])),
]


@pytest.mark.parametrize("name,fn,expected", BOOL_CASES, ids=[c[0] for c in BOOL_CASES])
def test_comparisons_give_bool_tensors(name, fn, expected):
    with np.errstate(divide="ignore", invalid="ignore"):
        out = fn(sn.tensor(A, requires_grad=True), sn.tensor(B))
    assert isinstance(out, sn.Tensor) and out.dtype == np.bool_ and not out.requires_grad
    np.testing.assert_array_equal(out.numpy(), expected)


def test_invert_of_a_float_tensor_raises():
    with pytest.raises(TypeError, match="bool and integer"):
        ~sn.tensor(A)


def test_where_needs_a_bool_condition():
    with pytest.raises(RuntimeError, match="bool"):
        sn.where(sn.tensor([1.0, 0.0]), sn.tensor(A[:2]), 0.0)


def t(dtype, shape=(2,)):
    return sn.tensor(np.ones(shape, dtype))


F32, F64, I64 = np.float32, np.float64, np.int64
# name, thunk giving a tensor, PyTorch's result dtype (torch.result_type's rules)
PROMOTION = [
    ("f32_plus_i64_arange", lambda: t(F32) + sn.tensor(np.arange(2)), F32),
    ("f32_times_python_float", lambda: t(F32) * 0.5, F32),
    ("python_float_minus_f32", lambda: 1.5 - t(F32), F32),
    ("f32_pow_python_int", lambda: t(F32) ** 2, F32),
    ("i64_times_python_float", lambda: t(I64) * 0.5, F32),
    ("i64_plus_python_int", lambda: t(I64) + 1, I64),
    ("i32_plus_python_int", lambda: t(np.int32) + 1, np.int32),
    ("f32_plus_f64", lambda: t(F32) + t(F64), F64),
    ("f16_plus_f32", lambda: t(np.float16) + t(F32), F32),
    ("f32_plus_f64_zero_dim", lambda: t(F32) + sn.tensor(np.array(2.0)), F32),
    ("i32_plus_f64_zero_dim", lambda: t(np.int32) + sn.tensor(np.array(2.0)), F64),
    ("i64_plus_i32_zero_dim", lambda: t(I64) + sn.tensor(np.array(2, np.int32)), I64),
    ("bool_plus_python_int", lambda: t(np.bool_) + 1, I64),
    ("bool_plus_bool", lambda: t(np.bool_) + t(np.bool_), np.bool_),
    ("u8_plus_i8", lambda: t(np.uint8) + t(np.int8), np.int16),
    ("i64_div_i64", lambda: t(I64) / t(I64), F32),
    ("i64_div_python_int", lambda: t(I64) / 2, F32),
    ("i64_sqrt", lambda: t(I64).sqrt(), F32),
    ("i64_exp", lambda: sn.exp(t(I64)), F32),
    ("i64_abs", lambda: t(I64).abs(), I64),
    ("i64_clamp_python_float", lambda: t(I64).clamp(min=0.5), F32),
    ("where_f32_python_float", lambda: sn.where(t(np.bool_), t(F32), 0.0), F32),
    ("where_f32_f64", lambda: sn.where(t(np.bool_), t(F32), t(F64)), F64),
    ("maximum_f32_i64", lambda: sn.maximum(t(F32), t(I64)), F32),
    ("masked_fill_keeps_dtype", lambda: t(F32).masked_fill(t(np.bool_), 2.5), F32),
    ("masked_fill_int_keeps_dtype", lambda: t(I64).masked_fill(t(np.bool_), 2), I64),
]


@pytest.mark.parametrize("name,fn,dtype", PROMOTION, ids=[c[0] for c in PROMOTION])
def test_type_promotion_as_pytorch(name, fn, dtype):
    assert fn().dtype == np.dtype(dtype)


def test_int_times_python_float_takes_the_default_dtype():
    with default_dtype(np.float64):
        assert (t(I64) * 0.5).dtype == np.float64
    np.testing.assert_array_equal((sn.tensor(np.arange(3)) * 0.5).numpy(), [0.0, 0.5, 1.0])


def test_gradient_comes_back_in_each_inputs_dtype():
    a = sn.tensor(np.ones(3, F32), requires_grad=True)
    b = sn.tensor(np.full(3, 2.0), requires_grad=True)
    out = a * b
    assert out.dtype == F64
    out.sum().backward()
    assert _grad(a).dtype == F32 and _grad(b).dtype == F64
    np.testing.assert_array_equal(_grad(a), [2.0, 2.0, 2.0])


@pytest.mark.parametrize("fn", [
    lambda x, w: x @ w,
    lambda x, w: sn.matmul(x, w),
    lambda x, w: F.linear(x, w),
    lambda x, w: F.linear(x, w, sn.tensor(np.zeros(3, F32))),
    lambda x, w: F.linear(x, w, activation="relu"),
    lambda x, w: sn.einsum("ij,kj->ik", x, w),
], ids=["matmul_op", "matmul", "linear", "linear_bias", "linear_relu", "einsum"])
def test_mismatched_float_dtypes_raise_naming_both(fn):
    x = sn.tensor(np.ones((2, 3), F64))
    w = sn.tensor(np.ones((3, 3), F32))
    with pytest.raises(RuntimeError, match="float64.*float32|float32.*float64"):
        fn(x, w)


def test_float64_batch_into_a_float32_model_raises():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(RuntimeError, match="same dtype"):
        model(sn.tensor(np.ones((5, 4), F64)))
    assert model(sn.tensor(np.ones((5, 4), F32))).dtype == F32


def test_bmm_needs_3d():
    with pytest.raises(RuntimeError, match="3-D"):
        sn.bmm(sn.tensor(randn(3, 4)), sn.tensor(randn(4, 2)))


def test_numpy_integer_scalars_promote_as_python_ints():
    ints = sn.tensor(np.array([1, 2]))
    assert (ints + np.int64(2)).dtype == np.int64  # PyTorch: int64 + integer scalar stays int64
    assert (sn.ones(2) * np.int32(2)).dtype == np.float32
    assert (ints * np.bool_(True)).dtype == np.int64
