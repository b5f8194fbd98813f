"""More Tensor methods (clone, the new_* factories, random fills, scans,
gather / scatter, step functions, small products): forward against a plain
NumPy expression, backward against float64 central finite differences, and
values pinned by hand from PyTorch's documentation where NumPy could share
a misreading (round half to even, gather / scatter index semantics, roll
over several dims, repeat_interleave)."""
import numpy as np
import pytest

import spmdnet as sn
from tests.helpers.op_tables import check_row

rng = np.random.default_rng(14)


def randn(*shape):
    return rng.standard_normal(shape)


def off_integers(*shape):
    """Values at least 0.1 from any half-integer (no jump under the finite differences)."""
    x = randn(*shape) * 3
    return np.floor(x) + 0.2 + 0.25 * (x - np.floor(x))


IDX = np.array([[2, 0], [1, 1], [0, 2]])
SCATTER_IDX = np.array([[0, 2, 1], [1, 0, 2]])


def np_gather(a, index, axis):
    return np.take_along_axis(a[:, :index.shape[1]] if axis == 0 else a[:index.shape[0]],
                              index, axis=axis)


def np_scatter(a, index, src, add):
    out = a.copy()
    for i, j in np.ndindex(index.shape):
        if add:
            out[i, index[i, j]] += src[i, j]
        else:
            out[i, index[i, j]] = src[i, j]
    return out


# name, tensor function, numpy reference, inputs; all differentiable
CASES = [
    ("clone", lambda a: a.clone() * 1.0, lambda a: a.copy(), [randn(3, 4)]),
    ("sn_clone", lambda a: sn.clone(a), lambda a: a, [randn(2)]),
    ("square", lambda a: a.square(), np.square, [randn(3, 4)]),
    ("sign", lambda a: a.sign() * a, lambda a: np.sign(a) * a, [off_integers(3, 4)]),
    ("floor", lambda a: a.floor() + a, lambda a: np.floor(a) + a, [off_integers(3, 4)]),
    ("ceil", lambda a: sn.ceil(a) * a, lambda a: np.ceil(a) * a, [off_integers(5)]),
    ("round", lambda a: a.round() - a, lambda a: np.round(a) - a, [off_integers(2, 3)]),
    ("round_decimals", lambda a: (a * 10).round(decimals=1),
     lambda a: np.round(a * 10, 1), [off_integers(4) / 100]),
    ("trunc", lambda a: sn.trunc(a) * a, lambda a: np.trunc(a) * a, [off_integers(6)]),
    ("lerp_scalar", lambda a, b: a.lerp(b, 0.3), lambda a, b: a + 0.3 * (b - a),
     [randn(3, 4), randn(4)]),
    ("lerp_tensor", lambda a, b, w: sn.lerp(a, b, w), lambda a, b, w: a + w * (b - a),
     [randn(3, 4), randn(3, 4), randn(3, 1)]),
    ("outer", lambda a, b: a.outer(b), np.outer, [randn(3), randn(4)]),
    ("addmm", lambda c, a, b: c.addmm(a, b), lambda c, a, b: c + a @ b,
     [randn(4), randn(3, 2), randn(2, 4)]),
    ("addmm_scaled", lambda c, a, b: sn.addmm(c, a, b, beta=0.5, alpha=-2.0),
     lambda c, a, b: 0.5 * c - 2.0 * (a @ b), [randn(3, 4), randn(3, 2), randn(2, 4)]),
    ("diag_vector", lambda a: a.diag(1), lambda a: np.diag(a, 1), [randn(3)]),
    ("diag_matrix", lambda a: sn.diag(a), np.diag, [randn(3, 4)]),
    ("diag_matrix_below", lambda a: a.diag(diagonal=-1), lambda a: np.diag(a, -1),
     [randn(4, 3)]),
    ("diag_matrix_above", lambda a: a.diag(2), lambda a: np.diag(a, 2), [randn(3, 5)]),
    ("cumsum", lambda a: a.cumsum(1), lambda a: np.cumsum(a, 1), [randn(3, 4)]),
    ("sn_cumsum", lambda a: sn.cumsum(a, dim=-1), lambda a: np.cumsum(a, -1), [randn(2, 3, 4)]),
    ("cumprod", lambda a: a.cumprod(0), lambda a: np.cumprod(a, 0), [randn(4, 3)]),
    ("cumprod_zeros", lambda a: sn.cumprod(a, 1), lambda a: np.cumprod(a, 1),
     [np.array([[0.5, 0.0, 2.0, -1.5], [1.2, -0.7, 0.0, 0.0], [0.0, 1.1, 0.9, 1.3]])]),
    ("flip", lambda a: a.flip((0, 2)), lambda a: np.flip(a, (0, 2)), [randn(2, 3, 4)]),
    ("sn_flip", lambda a: sn.flip(a, [-1]), lambda a: a[:, ::-1], [randn(3, 4)]),
    ("roll", lambda a: a.roll((1, -2), (0, 1)), lambda a: np.roll(a, (1, -2), (0, 1)),
     [randn(3, 4)]),
    ("roll_flat", lambda a: sn.roll(a, 5), lambda a: np.roll(a, 5), [randn(3, 4)]),
    ("gather", lambda a: a.gather(1, sn.tensor(IDX)), lambda a: np_gather(a, IDX, 1),
     [randn(4, 3)]),
    ("gather_dim0", lambda a: sn.gather(a, 0, sn.tensor(IDX.T)),
     lambda a: np_gather(a, IDX.T, 0), [randn(3, 4)]),
    ("scatter", lambda a, s: a.scatter(1, sn.tensor(SCATTER_IDX), s),
     lambda a, s: np_scatter(a, SCATTER_IDX, s, False), [randn(2, 4), randn(2, 3)]),
    ("scatter_value", lambda a: a.scatter(1, sn.tensor(SCATTER_IDX), 0.5),
     lambda a: np_scatter(a, SCATTER_IDX, np.full((2, 3), 0.5), False), [randn(2, 4)]),
    ("scatter_add", lambda a, s: sn.scatter_add(a, 1, sn.tensor(np.array([[0, 0, 3]])), s),
     lambda a, s: np_scatter(a, np.array([[0, 0, 3]]), s, True), [randn(2, 4), randn(2, 3)]),
    ("index_select", lambda a: a.index_select(1, sn.tensor([2, 0, 2])),
     lambda a: a[:, [2, 0, 2]], [randn(3, 4)]),
    ("repeat_interleave", lambda a: a.repeat_interleave(2, dim=0),
     lambda a: np.repeat(a, 2, axis=0), [randn(3, 2)]),
    ("repeat_interleave_counts", lambda a: sn.repeat_interleave(a, sn.tensor([1, 0, 3]), dim=1),
     lambda a: np.repeat(a, [1, 0, 3], axis=1), [randn(2, 3)]),
    ("repeat_interleave_flat", lambda a: a.repeat_interleave(2), lambda a: np.repeat(a, 2),
     [randn(2, 3)]),
    ("softmax", lambda a: a.softmax(-1),
     lambda a: np.exp(a) / np.exp(a).sum(-1, keepdims=True), [randn(3, 4)]),
    ("log_softmax", lambda a: a.log_softmax(dim=0),
     lambda a: a - np.log(np.exp(a).sum(0, keepdims=True)), [randn(3, 4)]),
]


@pytest.mark.parametrize("name, fn, ref, inputs", CASES, ids=[c[0] for c in CASES])
def test_method_matches_numpy_and_finite_differences(name, fn, ref, inputs):
    check_row(fn, ref, inputs)


T = sn.tensor
X42 = T(np.arange(1, 9)).view(4, 2)
SRC = T(np.arange(1, 11)).float().reshape(2, 5)

# name, computed, expected (PyTorch's documented values)
PINNED = [
    ("round_half_even", lambda: T([0.5, 1.5, 2.5, -0.5, -2.5, 3.7]).round(),
     [0.0, 2.0, 2.0, -0.0, -2.0, 4.0]),
    ("round_decimals_half_even", lambda: T([1.125, 0.375], dtype=sn.float64).round(decimals=2),
     [1.12, 0.38]),
    ("sign", lambda: T([0.7, -1.2, 0.0, 2.3]).sign(), [1.0, -1.0, 0.0, 1.0]),
    ("trunc", lambda: T([3.4742, 0.5466, -0.8008, -1.9]).trunc(), [3.0, 0.0, -0.0, -1.0]),
    ("floor_ceil_int", lambda: T([1, -2]).floor() + T([1, -2]).ceil(), [2, -4]),
    ("gather", lambda: T([[1, 2], [3, 4]]).gather(1, T([[0, 0], [1, 0]])), [[1, 1], [4, 3]]),
    ("scatter_dim0", lambda: sn.zeros(3, 5).scatter(0, T([[0, 1, 2, 0]]), SRC),
     [[1, 0, 0, 4, 0], [0, 2, 0, 0, 0], [0, 0, 3, 0, 0]]),
    ("scatter_dim1", lambda: sn.zeros(3, 5).scatter(1, T([[0, 1, 2], [0, 1, 4]]), SRC),
     [[1, 2, 3, 0, 0], [6, 7, 0, 0, 8], [0, 0, 0, 0, 0]]),
    ("scatter_add", lambda: sn.zeros(3, 5).scatter_add(
        0, T([[0, 1, 2, 0, 0], [0, 1, 2, 2, 2]]), sn.ones(2, 5)),
     [[2, 0, 0, 1, 1], [0, 2, 0, 0, 0], [0, 0, 2, 1, 1]]),
    ("roll_flat", lambda: X42.roll(1), [[8, 1], [2, 3], [4, 5], [6, 7]]),
    ("roll_dim0", lambda: X42.roll(-1, 0), [[3, 4], [5, 6], [7, 8], [1, 2]]),
    ("roll_two_dims", lambda: sn.roll(X42, shifts=(2, 1), dims=(0, 1)),
     [[6, 5], [8, 7], [2, 1], [4, 3]]),
    ("repeat_interleave", lambda: T([[1, 2], [3, 4]]).repeat_interleave(2),
     [1, 1, 2, 2, 3, 3, 4, 4]),
    ("repeat_interleave_dim", lambda: T([[1, 2], [3, 4]]).repeat_interleave(3, dim=1),
     [[1, 1, 1, 2, 2, 2], [3, 3, 3, 4, 4, 4]]),
    ("repeat_interleave_counts", lambda: sn.repeat_interleave(T([[1, 2], [3, 4]]), T([1, 2]),
                                                              dim=0),
     [[1, 2], [3, 4], [3, 4]]),
    ("cumsum_int", lambda: T([1, 2, 3], dtype=sn.int32).cumsum(0), [1, 3, 6]),
    ("diag", lambda: T([1.0, 2.0]).diag(-1), [[0, 0, 0], [1, 0, 0], [0, 2, 0]]),
    ("addmm_beta0_ignores_nan", lambda: sn.addmm(T([float("nan")]), sn.ones(1, 2),
                                                 sn.ones(2, 1), beta=0), [[2.0]]),
]


@pytest.mark.parametrize("name, fn, expected", PINNED, ids=[c[0] for c in PINNED])
def test_pinned_values(name, fn, expected):
    out = fn().numpy()
    np.testing.assert_allclose(out, np.array(expected, dtype=out.dtype), rtol=1e-6)
    if name == "round_half_even":
        assert np.signbit(out[3])


def test_dtypes_of_results():
    assert T([1, 2], dtype=sn.int32).cumsum(0).dtype == np.int64
    assert T([True, True]).cumsum(0).dtype == np.int64
    assert T([1, 2]).cumsum(0, dtype=sn.float32).dtype == np.float32
    assert T([True]).square().dtype == np.int64
    assert T([2], dtype=sn.int32).square().dtype == np.int32
    assert T([1.5]).round().dtype == np.float32


def test_step_functions_have_zero_gradient():
    for name in ("sign", "floor", "ceil", "round", "trunc"):
        x = T([0.3, -1.7, 2.5], requires_grad=True)
        getattr(x, name)().sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), 0.0)


def test_clone_is_a_copy_in_the_graph():
    x = T([1.0, 2.0], requires_grad=True)
    y = x.clone()
    assert y.requires_grad and not y.is_leaf
    assert not np.shares_memory(y.array, x.array)
    (y * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def test_requires_grad_():
    x = sn.ones(2)
    assert x.requires_grad_() is x and x.requires_grad
    assert x.requires_grad_(False) is x and not x.requires_grad
    y = sn.ones(2, requires_grad=True) * 2
    assert y.requires_grad_() is y
    with pytest.raises(RuntimeError, match="leaf variables"):
        y.requires_grad_(False)


def test_new_factories_take_dtype_and_device_of_self():
    x = sn.ones(2, dtype=sn.float64)
    for t in (x.new_zeros(2, 3), x.new_zeros((2, 3)), x.new_ones([2, 3]), x.new_empty(2, 3),
              x.new_full((2, 3), 7)):
        assert t.shape == (2, 3) and t.dtype == np.float64 and t.device == "cpu"
        assert t.is_leaf and not t.requires_grad
    np.testing.assert_array_equal(x.new_full((2,), 7).numpy(), [7.0, 7.0])
    np.testing.assert_array_equal(x.new_ones(2).numpy(), [1.0, 1.0])
    t = x.new_tensor([1, 2])
    assert t.dtype == np.float64 and t.tolist() == [1.0, 2.0]
    assert x.new_zeros(3, dtype=sn.int64).dtype == np.int64
    assert x.new_tensor([1.5], requires_grad=True).requires_grad


def test_random_fills_use_spmdnets_generator():
    sn.manual_seed(3)
    a = sn.empty(500).normal_(2.0, 0.5)
    sn.manual_seed(3)
    b = sn.empty(500).normal_(mean=2.0, std=0.5)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert abs(a.numpy().mean() - 2.0) < 0.1 and abs(a.numpy().std() - 0.5) < 0.1
    u = sn.empty(1000, dtype=sn.float64).uniform_(-0.1, 0.1)
    assert u.dtype == np.float64 and -0.1 <= u.numpy().min() and u.numpy().max() < 0.1
    v = sn.zeros(100).uniform_(**{"from": 2.0, "to": 3.0})
    assert 2.0 <= v.numpy().min() and v.numpy().max() < 3.0
    assert 0.0 <= sn.zeros(10).uniform_().numpy().min()


def test_random_fills_follow_the_in_place_rules():
    w = sn.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        w.normal_()
    with sn.no_grad():
        assert w.uniform_(0, 1) is w
    assert w.is_leaf and w.requires_grad


def test_is_contiguous_and_type():
    x = sn.ones(2, 3)
    assert x.is_contiguous() and not x.t().is_contiguous()
    assert x.t().contiguous().is_contiguous()
    assert x.type() == "torch.FloatTensor"
    assert x.long().type() == "torch.LongTensor"
    assert T([True]).type() == "torch.BoolTensor"
    assert x.type(sn.float64).dtype == np.float64
    assert x.type("torch.DoubleTensor").dtype == np.float64
    assert x.type(sn.float32) is x


ERRORS = [
    ("gather_out_of_range", lambda: sn.ones(2, 2).gather(1, T([[0, 2]])), RuntimeError),
    ("gather_negative", lambda: sn.ones(2, 2).gather(1, T([[0, -1]])), RuntimeError),
    ("gather_float_index", lambda: sn.ones(2, 2).gather(1, T([[0.0]])), RuntimeError),
    ("gather_index_ndim", lambda: sn.ones(2, 2).gather(1, T([0])), RuntimeError),
    ("scatter_dtype", lambda: sn.ones(2, 2).scatter(1, T([[0]]), T([[1]])), RuntimeError),
    ("index_select_2d", lambda: sn.ones(2, 2).index_select(0, T([[0]])), RuntimeError),
    ("flip_dup", lambda: sn.ones(2, 2).flip((0, -2)), RuntimeError),
    ("roll_mismatch", lambda: sn.ones(2, 2).roll((1, 1), 0), RuntimeError),
    ("outer_2d", lambda: sn.outer(sn.ones(2, 2), sn.ones(2)), RuntimeError),
    ("diag_3d", lambda: sn.ones(2, 2, 2).diag(), RuntimeError),
    ("cumsum_dim", lambda: sn.ones(2).cumsum(1), IndexError),
    ("softmax_needs_dim", lambda: sn.ones(2).softmax(), TypeError),
]


@pytest.mark.parametrize("name, fn, error", ERRORS, ids=[c[0] for c in ERRORS])
def test_errors(name, fn, error):
    with pytest.raises(error):
        fn()
