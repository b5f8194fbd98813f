"""nn.init against PyTorch's documented formulas: gains, fans, the bounds and
spreads of every initialiser (statistical tests on large tensors), in-place
filling, seeding, and Linear's default (kaiming_uniform_ with a=sqrt(5))."""
import math

import numpy as np
import pytest

import spmdnet as sn
from spmdnet import nn
from spmdnet.nn import init

SHAPE = (300, 400)  # fan_in 400, fan_out 300; 120000 samples


def fresh(shape=SHAPE, dtype=np.float32):
    return nn.Parameter(np.full(shape, np.nan, dtype=dtype))


# -- gains and fans ------------------------------------------------------------------------
# hand values from PyTorch's calculate_gain table
GAINS = [("linear", None, 1.0), ("conv1d", None, 1.0), ("conv2d", None, 1.0),
         ("conv_transpose3d", None, 1.0), ("sigmoid", None, 1.0), ("tanh", None, 5 / 3),
         ("relu", None, 1.4142135623730951), ("leaky_relu", None, 1.4141428569978354),
         ("leaky_relu", 0.2, 1.3867504905630728), ("leaky_relu", 0, 1.4142135623730951),
         ("selu", None, 0.75)]


@pytest.mark.parametrize("nonlinearity, param, expected", GAINS)
def test_calculate_gain(nonlinearity, param, expected):
    assert init.calculate_gain(nonlinearity, param) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("args", [("softmax",), ("leaky_relu", True), ("leaky_relu", "0.1")])
def test_calculate_gain_rejects(args):
    with pytest.raises(ValueError):
        init.calculate_gain(*args)


@pytest.mark.parametrize("shape, fans", [((4, 3), (3, 4)), ((8, 3, 5, 5), (75, 200)),
                                         ((6, 2, 7), (14, 42)), ((5, 0), (0, 5))])
def test_fans_multiply_the_receptive_field(shape, fans):
    assert init._calculate_fan_in_and_fan_out(fresh(shape)) == fans


def test_fans_need_two_dims_and_a_known_mode():
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.xavier_uniform_(fresh((5,)))
    with pytest.raises(ValueError, match="fan_avg"):
        init.kaiming_uniform_(fresh(), mode="fan_avg")


# -- distributions: (call, low, high, mean, std) with hand-computed numbers ----------------
# fan_in 400, fan_out 300: xavier a = sqrt(6/700), kaiming (a=0, leaky_relu, fan_in)
# bound = sqrt(2) * sqrt(3/400) = sqrt(6/400); a uniform's std is its bound / sqrt(3)
UNIFORM = [
    (lambda t: init.uniform_(t), 0.0, 1.0),
    (lambda t: init.uniform_(t, -3.0, -1.0), -3.0, -1.0),
    (lambda t: init.xavier_uniform_(t), -0.09258200997725514, 0.09258200997725514),
    (lambda t: init.xavier_uniform_(t, gain=2.0), -0.18516401995451028, 0.18516401995451028),
    (lambda t: init.kaiming_uniform_(t), -0.12247448713915890, 0.12247448713915890),
    (lambda t: init.kaiming_uniform_(t, a=math.sqrt(5)), -0.05, 0.05),
    (lambda t: init.kaiming_uniform_(t, mode="fan_out", nonlinearity="relu"),
     -0.14142135623730950, 0.14142135623730950),
]
NORMAL = [
    (lambda t: init.normal_(t), 0.0, 1.0),
    (lambda t: init.normal_(t, 2.0, 0.5), 2.0, 0.5),
    (lambda t: init.xavier_normal_(t), 0.0, 0.05345224838248488),
    (lambda t: init.kaiming_normal_(t), 0.0, 0.07071067811865475),
    (lambda t: init.kaiming_normal_(t, mode="fan_out", nonlinearity="tanh"),
     0.0, 0.09622504486493763),
]


def draw(fill, seed):
    """Fill a fresh float32 SHAPE parameter; check it is filled in place and returned."""
    sn.manual_seed(seed)
    t = fresh()
    assert fill(t) is t and t.dtype == np.float32
    return t.numpy().astype(np.float64)


@pytest.mark.parametrize("row", range(len(UNIFORM)))
def test_uniform_family_bounds_and_flatness(row):
    fill, lo, hi = UNIFORM[row]
    w = draw(fill, row)
    assert lo <= w.min() and w.max() <= hi
    width = hi - lo
    assert w.min() < lo + 1e-3 * width and w.max() > hi - 1e-3 * width
    counts, _ = np.histogram(w, bins=10, range=(lo, hi))
    np.testing.assert_allclose(counts / w.size, 0.1, atol=0.004)
    np.testing.assert_allclose(w.std(), width / math.sqrt(12), rtol=0.01)


@pytest.mark.parametrize("row", range(len(NORMAL)))
def test_normal_family_mean_and_std(row):
    fill, mean, std = NORMAL[row]
    w = draw(fill, row)
    assert abs(w.mean() - mean) < 0.01 * std
    np.testing.assert_allclose(w.std(), std, rtol=0.01)
    z = (w - mean) / std  # normal, not uniform: the 4th moment is 3
    assert abs((z ** 4).mean() - 3.0) < 0.1


def truncated_moments(mean, std, a, b):
    """Mean and std of N(mean, std²) truncated to [a, b], closed form."""
    lo, hi = (a - mean) / std, (b - mean) / std
    pdf = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    mass = 0.5 * (math.erf(hi / math.sqrt(2)) - math.erf(lo / math.sqrt(2)))
    m = (pdf(lo) - pdf(hi)) / mass
    var = 1 + (lo * pdf(lo) - hi * pdf(hi)) / mass - m * m
    return mean + std * m, std * math.sqrt(var)


@pytest.mark.parametrize("mean, std, a, b", [(0.0, 1.0, -2.0, 2.0), (0.0, 1.0, -1.0, 2.0),
                                             (1.0, 3.0, 0.0, 1.5), (0.0, 0.02, -2.0, 2.0)])
def test_trunc_normal_moments(mean, std, a, b):
    sn.manual_seed(0)
    t = init.trunc_normal_(fresh(dtype=np.float64), mean, std, a, b)
    w = t.numpy()
    assert a <= w.min() and w.max() <= b
    m, s = truncated_moments(mean, std, a, b)
    assert abs(w.mean() - m) < 0.01 * s
    np.testing.assert_allclose(w.std(), s, rtol=0.01)


def test_trunc_normal_bounds_are_absolute_not_in_stds():
    # ViT's trunc_normal_(w, std=0.02): a=-2, b=2 are VALUES, so almost nothing is
    # cut; read as ±2 std they would cut at ±0.04 and shrink the std to 0.0176
    sn.manual_seed(0)
    w = init.trunc_normal_(fresh(dtype=np.float64), std=0.02).numpy()
    np.testing.assert_allclose(w.std(), 0.02, rtol=0.01)
    assert (np.abs(w) > 0.04).mean() > 0.04  # P(|z| > 2) = 0.0455
    # a mean far outside [a, b]: every value still lies in [a, b], piled at b (with
    # PyTorch's warning)
    with pytest.warns(UserWarning, match="more than 2 std from"):
        w = init.trunc_normal_(fresh((1000,)), mean=10.0, std=2.0, a=-2.0, b=2.0).numpy()
    assert -2.0 <= w.min() and w.max() <= 2.0 and np.median(w) > 1.5
    with pytest.raises(ValueError):
        init.trunc_normal_(fresh(), a=1.0, b=-1.0)


# -- fills ------------------------------------------------------------------------------
FILLS = [(init.zeros_, (), 0.0), (init.ones_, (), 1.0), (init.constant_, (0.25,), 0.25)]


@pytest.mark.parametrize("fill, args, value", FILLS)
def test_constant_fills(fill, args, value):
    t = fresh((3, 4))
    assert fill(t, *args) is t
    np.testing.assert_array_equal(t.numpy(), np.full((3, 4), value, np.float32))


def test_eye_():
    t = init.eye_(fresh((2, 3)))
    np.testing.assert_array_equal(t.numpy(), np.eye(2, 3))
    with pytest.raises(ValueError):
        init.eye_(fresh((2, 2, 2)))


# -- in place, outside autograd, seeded -------------------------------------------------
def test_in_place_on_a_parameter_with_or_without_no_grad():
    lin = nn.Linear(4, 3)
    array = lin.weight.array
    with sn.no_grad():
        assert init.normal_(lin.weight, 0.0, 0.1) is lin.weight
    init.xavier_uniform_(lin.weight)
    assert lin.weight.array is array  # filled in place: views onto it stay valid
    assert lin.weight.requires_grad and lin.weight.grad is None and lin.weight.is_leaf
    assert lin.weight.dtype == np.float32


def test_seed_fixes_the_values_and_generator_argument():
    sn.manual_seed(7)
    a = init.kaiming_normal_(fresh((20, 10))).numpy()
    sn.manual_seed(7)
    b = init.kaiming_normal_(fresh((20, 10))).numpy()
    np.testing.assert_array_equal(a, b)
    g1, g2 = sn.Generator().manual_seed(3), sn.Generator().manual_seed(3)
    np.testing.assert_array_equal(init.uniform_(fresh((5, 5)), generator=g1).numpy(),
                                  init.uniform_(fresh((5, 5)), generator=g2).numpy())
    with pytest.raises(TypeError, match="spmdnet.Generator"):
        init.uniform_(fresh((2,)), generator=np.random.default_rng(3))


def test_zero_element_kaiming_is_a_no_op_with_a_warning():
    t = fresh((0, 3))
    with pytest.warns(UserWarning, match="zero-element"):
        assert init.kaiming_uniform_(t) is t


def test_linear_default_init_is_kaiming_uniform_a_sqrt5():
    """PyTorch's Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)) on the
    weight, then U(±1/sqrt(fan_in)) on the bias, from the same stream."""
    sn.manual_seed(11)
    lin = nn.Linear(50, 30)
    sn.manual_seed(11)
    w = init.kaiming_uniform_(fresh((30, 50)), a=math.sqrt(5))
    b = init.uniform_(fresh((30,)), -1 / math.sqrt(50), 1 / math.sqrt(50))
    np.testing.assert_array_equal(lin.weight.numpy(), w.numpy())
    np.testing.assert_array_equal(lin.bias.numpy(), b.numpy())
    sn.manual_seed(0)
    big = nn.Linear(400, 300)
    for p, near in ((big.weight, 0.0499), (big.bias, 0.0475)):  # bound 1/sqrt(400) = 0.05
        w = p.numpy()
        assert np.abs(w).max() <= 0.05 and w.max() > near and w.min() < -near
    with pytest.warns(UserWarning, match="zero-element"):
        empty = nn.Linear(0, 3)  # as PyTorch: a zero-element weight, bias bound 0
    np.testing.assert_array_equal(empty.bias.numpy(), np.zeros(3))


def test_host_array_helpers_refuse_a_tensor():
    with pytest.raises(TypeError, match="uniform_"):
        init.uniform(fresh((2, 2)), 1.0)
