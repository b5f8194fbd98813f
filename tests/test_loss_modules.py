"""Loss modules (nn.CrossEntropyLoss ...) against float64 formulas written
out here, hand-computed small cases, and finite differences for gradients."""
import warnings

import numpy as np
import pytest

import spmdnet as sn
from spmdnet import nn
from tests.helpers.oracles import numeric_gradient

RNG = np.random.default_rng(3)
X = RNG.standard_normal((4, 3))
Y = RNG.random((4, 3))
LABELS = np.array([0, 2, 1, 2])


def t(a, grad=False):
    return sn.tensor(np.array(a, dtype=np.float64), requires_grad=grad)


def reduce(losses, reduction, count=None):
    if reduction == "none":
        return losses
    total = losses.sum()
    return total / (losses.size if count is None else count) if reduction == "mean" else total


def log_softmax(x):
    z = x - x.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def check_grads(module, x, y, wrt_target=False):
    """Autograd of the summed output against finite differences, for the input
    (and the target)."""
    a, b = t(x, True), t(y, wrt_target)
    module(a, b).sum().backward()
    np.testing.assert_allclose(
        a.grad.array, numeric_gradient(lambda v: float(module(t(v), t(y)).sum().item()), x),
        rtol=1e-6, atol=1e-8)
    if wrt_target:
        np.testing.assert_allclose(
            b.grad.array, numeric_gradient(lambda v: float(module(t(x), t(v)).sum().item()), y),
            rtol=1e-6, atol=1e-8)


# -- hand-computed small cases ---------------------------------------------------------------
def test_huber_and_smooth_l1_by_hand():
    x, y = t([0.5, 3.0, -1.0]), t([0.0, 0.0, 0.0])
    # delta 1: 0.5*0.25, 1*(3-0.5), 1*(1-0.5)
    assert nn.HuberLoss(reduction="none")(x, y).array.tolist() == [0.125, 2.5, 0.5]
    # delta 2: 0.5*0.25, 2*(3-1), 0.5*1
    assert nn.HuberLoss(reduction="sum", delta=2.0)(x, y).item() == pytest.approx(4.625)
    # smooth l1, beta 2: 0.25/4, 3-1, 1/4  == huber(delta 2) / 2
    np.testing.assert_allclose(nn.SmoothL1Loss(reduction="none", beta=2.0)(x, y).array,
                               [0.0625, 2.0, 0.25])


def test_kl_div_by_hand():
    logp = t(np.log([[0.5, 0.5], [0.25, 0.75]]))
    q = t([[0.5, 0.5], [0.0, 1.0]])
    # row 0: 0; row 1: 0 (y = 0 contributes 0) + 1 * (log 1 - log .75)
    expected = -np.log(0.75)
    assert nn.KLDivLoss(reduction="batchmean")(logp, q).item() == pytest.approx(expected / 2)
    assert nn.KLDivLoss(reduction="sum")(logp, q).item() == pytest.approx(expected)
    with pytest.warns(UserWarning, match="batchmean"):
        assert nn.KLDivLoss()(logp, q).item() == pytest.approx(expected / 4)
    logq = t(np.log([[0.5, 0.5], [0.2, 0.8]]))
    by_hand = 0.2 * np.log(0.2 / 0.25) + 0.8 * np.log(0.8 / 0.75)
    assert nn.KLDivLoss(reduction="sum", log_target=True)(logp, logq).item() == \
        pytest.approx(by_hand)


def test_cross_entropy_by_hand():
    # logits [0, log 3] -> p = [1/4, 3/4]; label 1: -log(3/4); label 0: -log(1/4)
    x = t([[0.0, np.log(3.0)], [0.0, np.log(3.0)]])
    labels = sn.tensor(np.array([1, 0]))
    assert nn.CrossEntropyLoss(reduction="sum")(x, labels).item() == \
        pytest.approx(-np.log(0.75) - np.log(0.25))
    # weight [2, 1]: sum 1*(-log .75) + 2*(-log .25), mean divides by 3
    loss = nn.CrossEntropyLoss(weight=t([2.0, 1.0]))(x, labels)
    assert loss.item() == pytest.approx((-np.log(0.75) - 2 * np.log(0.25)) / 3)
    # ignore_index drops row 1
    assert nn.CrossEntropyLoss(ignore_index=0)(x, labels).item() == pytest.approx(-np.log(0.75))


# -- every module against its formula --------------------------------------------------------
def bce_logits(x, y, pos_weight=1.0):
    log_sig = -np.logaddexp(0, -x)
    log_one_minus = -np.logaddexp(0, x)
    return -(pos_weight * y * log_sig + (1 - y) * log_one_minus)


SIG = 1 / (1 + np.exp(-X))
W3 = np.array([0.5, 2.0, 1.5])
FORMULAS = [
    (lambda r: nn.MSELoss(reduction=r), X, Y, lambda: (X - Y) ** 2),
    (lambda r: nn.L1Loss(reduction=r), X, Y, lambda: np.abs(X - Y)),
    (lambda r: nn.SmoothL1Loss(reduction=r, beta=0.7), X, Y,
     lambda: np.where(np.abs(X - Y) < 0.7, 0.5 * (X - Y) ** 2 / 0.7, np.abs(X - Y) - 0.35)),
    (lambda r: nn.HuberLoss(reduction=r, delta=0.7), X, Y,
     lambda: np.where(np.abs(X - Y) < 0.7, 0.5 * (X - Y) ** 2, 0.7 * (np.abs(X - Y) - 0.35))),
    (lambda r: nn.BCELoss(reduction=r), SIG, Y,
     lambda: -(Y * np.log(SIG) + (1 - Y) * np.log(1 - SIG))),
    (lambda r: nn.BCELoss(weight=t(W3), reduction=r), SIG, Y,
     lambda: -W3 * (Y * np.log(SIG) + (1 - Y) * np.log(1 - SIG))),
    (lambda r: nn.BCEWithLogitsLoss(reduction=r), X, Y, lambda: bce_logits(X, Y)),
    (lambda r: nn.BCEWithLogitsLoss(pos_weight=t(W3), weight=t(W3[::-1]), reduction=r), X, Y,
     lambda: W3[::-1] * bce_logits(X, Y, W3)),
    (lambda r: nn.KLDivLoss(reduction=r), X, Y, lambda: Y * (np.log(Y) - X)),
    (lambda r: nn.KLDivLoss(reduction=r, log_target=True), X, Y,
     lambda: np.exp(Y) * (Y - X)),
]


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("make,x,y,formula", FORMULAS)
def test_pointwise_modules_match_formulas(make, x, y, formula, reduction):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kl_div's 'mean' warning
        out = make(reduction)(t(x), t(y))
    np.testing.assert_allclose(out.array, reduce(formula(), reduction), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_class_index_modules_match_formulas(reduction):
    w = np.array([0.3, 1.0, 2.0])
    logp = log_softmax(X)
    rows = np.arange(4)
    keep = LABELS != 2  # ignore_index=2
    per = -w[LABELS] * logp[rows, LABELS] * keep
    count = (w[LABELS] * keep).sum()
    ce = nn.CrossEntropyLoss(weight=t(w), ignore_index=2, reduction=reduction)
    nll = nn.NLLLoss(weight=t(w), ignore_index=2, reduction=reduction)
    labels = sn.tensor(LABELS)
    np.testing.assert_allclose(ce(t(X), labels).array, reduce(per, reduction, count),
                               rtol=1e-12)
    np.testing.assert_allclose(nll(t(logp), labels).array, reduce(per, reduction, count),
                               rtol=1e-12)
    eps = 0.2  # label smoothing: (1-eps)*w_y*(-logp_y) + eps/C * sum_c w_c*(-logp_c)
    smooth = (1 - eps) * -w[LABELS] * logp[rows, LABELS] - eps / 3 * (w * logp).sum(axis=1)
    ls = nn.CrossEntropyLoss(weight=t(w), label_smoothing=eps, reduction=reduction)
    np.testing.assert_allclose(ls(t(X), labels).array,
                               reduce(smooth, reduction, w[LABELS].sum()), rtol=1e-12)


# -- gradients against finite differences ----------------------------------------------------
@pytest.mark.parametrize("make,x,y,formula", FORMULAS)
def test_gradients_match_finite_differences(make, x, y, formula):
    module = make("sum")
    kl_or_regression = isinstance(module, (nn.KLDivLoss, nn.MSELoss, nn.HuberLoss, nn.L1Loss,
                                           nn.SmoothL1Loss))
    check_grads(module, x, y, wrt_target=kl_or_regression)


def test_class_index_gradients_match_finite_differences():
    labels = sn.tensor(LABELS)
    for module in (nn.CrossEntropyLoss(weight=t([0.3, 1.0, 2.0]), label_smoothing=0.1),
                   nn.NLLLoss(ignore_index=1, reduction="sum")):
        a = t(X, True)
        module(a, labels).backward()
        fd = numeric_gradient(lambda v, m=module: float(m(t(v), labels).item()), X)
        np.testing.assert_allclose(a.grad.array, fd, rtol=1e-6, atol=1e-9)


# -- module protocol -------------------------------------------------------------------------
def test_weights_are_buffers_in_state_dict():
    w, pw = np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.5, 4.0])
    assert list(nn.CrossEntropyLoss(weight=t(w)).state_dict()) == ["weight"]
    assert list(nn.NLLLoss().state_dict()) == []
    assert list(nn.BCEWithLogitsLoss(pos_weight=t(pw)).state_dict()) == ["pos_weight"]
    both = nn.BCEWithLogitsLoss(weight=t(w), pos_weight=t(pw))
    assert list(both.state_dict()) == ["weight", "pos_weight"]
    other = nn.BCEWithLogitsLoss(weight=t(np.zeros(3)), pos_weight=t(np.zeros(3)))
    other.load_state_dict(both.state_dict())
    np.testing.assert_array_equal(other.pos_weight.array, pw)
    assert not list(both.parameters()) and len(list(both.buffers())) == 2
    # the loaded buffers are used: the same value as the module they came from
    assert other(t(X), t(Y)).item() == both(t(X), t(Y)).item()


def test_constructor_arguments_kept_and_checked():
    ce = nn.CrossEntropyLoss(ignore_index=-1, label_smoothing=0.1, reduction="sum")
    assert (ce.ignore_index, ce.label_smoothing, ce.reduction) == (-1, 0.1, "sum")
    assert nn.KLDivLoss(reduction="batchmean", log_target=True).reduction == "batchmean"
    assert nn.HuberLoss().delta == 1.0 and nn.SmoothL1Loss().beta == 1.0
    with pytest.raises(ValueError, match="'avg'"):
        nn.MSELoss(reduction="avg")
    with pytest.raises(ValueError, match="delta must be positive, got 0"):
        nn.HuberLoss(delta=0)
    with pytest.raises(ValueError, match="label_smoothing"):
        nn.CrossEntropyLoss(label_smoothing=1.5)
    with pytest.warns(UserWarning, match="size_average"):
        assert nn.L1Loss(size_average=False).reduction == "sum"
    with pytest.warns(UserWarning, match="size_average"):
        assert nn.MSELoss(reduce=False).reduction == "none"


def test_loss_module_in_a_training_step():
    """The PyTorch idiom: criterion = nn.CrossEntropyLoss(); loss = criterion(out, y)."""
    sn.manual_seed(0)
    model = nn.Linear(3, 3).double()
    criterion = nn.CrossEntropyLoss()
    loss = criterion(model(t(X)), sn.tensor(LABELS))
    loss.backward()
    expected = -log_softmax(X @ model.weight.array.T + model.bias.array)[np.arange(4), LABELS]
    assert loss.item() == pytest.approx(expected.mean(), rel=1e-12)
    assert model.weight.grad is not None
