"""The PyTorch schedulers against their closed forms written out here,
hand-worked cases for ReduceLROnPlateau and SequentialLR, and state-dict
round trips."""
import math
import warnings

import numpy as np
import pytest

from spmdnet.nn import Parameter
from spmdnet.optim import SGD, Adagrad, Adam
from spmdnet.optim.lr_scheduler import ConstantLR, CosineAnnealingLR, \
    CosineAnnealingWarmRestarts, ExponentialLR, LinearLR, MultiplicativeLR, MultiStepLR, \
    OneCycleLR, PolynomialLR, ReduceLROnPlateau, SequentialLR

BASES = (1.0, 0.3)


def sgd(**kw):
    """Two param groups with base lrs 1.0 and 0.3."""
    return SGD([{"params": [Parameter(np.zeros(1))]},
                {"params": [Parameter(np.zeros(1))], "lr": BASES[1]}], lr=BASES[0], **kw)


def lrs_over(sched, n):
    """get_last_lr() after construction and after each of n steps, checked
    against the optimizer's own lrs."""
    out = [sched.get_last_lr()]
    for _ in range(n):
        sched.step()
        out.append(sched.get_last_lr())
        assert [g["lr"] for g in sched.optimizer.param_groups] == out[-1]
    return np.array(out)


def cosine(high, low, fraction):
    return low + (high - low) * (1 + math.cos(math.pi * fraction)) / 2


def sgdr(base, eta_min, t0, mult, epoch):
    """SGDR written from the restart times: cycle i has length t0 * mult**i."""
    start, length = 0, t0
    while epoch >= start + length:
        start, length = start + length, length * mult
    return cosine(base, eta_min, (epoch - start) / length)


CLOSED_FORMS = [
    (lambda o: MultiStepLR(o, [3, 7, 7, 12], gamma=0.5),
     lambda b, e: b * 0.5 ** sum(m <= e for m in [3, 7, 7, 12])),
    (lambda o: ExponentialLR(o, 0.9), lambda b, e: b * 0.9 ** e),
    (lambda o: CosineAnnealingLR(o, 10, eta_min=1e-3),
     lambda b, e: 1e-3 + (b - 1e-3) * (1 + math.cos(math.pi * e / 10)) / 2),
    (lambda o: CosineAnnealingWarmRestarts(o, 4, eta_min=0.01),
     lambda b, e: sgdr(b, 0.01, 4, 1, e)),
    (lambda o: CosineAnnealingWarmRestarts(o, 3, T_mult=2),
     lambda b, e: sgdr(b, 0.0, 3, 2, e)),
    (lambda o: LinearLR(o, start_factor=0.25, end_factor=0.9, total_iters=6),
     lambda b, e: b * (0.25 + 0.65 * min(e, 6) / 6)),
    (lambda o: PolynomialLR(o, total_iters=8, power=2.0),
     lambda b, e: b * (1 - min(e, 8) / 8) ** 2),
    (lambda o: ConstantLR(o, factor=0.5, total_iters=4),
     lambda b, e: b * (0.5 if e < 4 else 1.0)),
    (lambda o: MultiplicativeLR(o, lambda e: 0.95), lambda b, e: b * 0.95 ** e),
]


@pytest.mark.parametrize("make,closed", CLOSED_FORMS)
def test_schedules_match_closed_forms(make, closed):
    got = lrs_over(make(sgd()), 40)
    want = np.array([[closed(b, e) for b in BASES] for e in range(41)])
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def one_cycle_ref(step, total, top, pct, div=25.0, final_div=1e4, three_phase=False,
                  cos=True):
    """The 1cycle lr written from its phase table."""
    low, floor = top / div, top / div / final_div
    anneal = cosine if cos else (lambda a, b, f: a + (b - a) * f)
    up = pct * total - 1
    phases = [(0, up, low, top), (up, total - 1, top, floor)]
    if three_phase:
        down = 2 * pct * total - 2
        phases = [(0, up, low, top), (up, down, top, low), (down, total - 1, low, floor)]
    for k, (start, end, a, b) in enumerate(phases):
        if step <= end or k == len(phases) - 1:
            return anneal(a, b, (step - start) / (end - start))


@pytest.mark.parametrize("kw", [{}, {"three_phase": True, "anneal_strategy": "linear",
                                     "pct_start": 0.25}])
def test_one_cycle_lr_and_momentum(kw):
    opt = sgd(momentum=0.9)
    sched = OneCycleLR(opt, max_lr=[1.0, 0.5], total_steps=40, **kw)
    moms = [opt.param_groups[0]["momentum"]]
    got = [sched.get_last_lr()]
    for _ in range(39):
        sched.step()
        got.append(sched.get_last_lr())
        moms.append(opt.param_groups[0]["momentum"])
    ref = {"pct": kw.get("pct_start", 0.3), "three_phase": kw.get("three_phase", False),
           "cos": kw.get("anneal_strategy", "cos") == "cos"}
    want = [[one_cycle_ref(s, 40, top, **ref) for top in (1.0, 0.5)] for s in range(40)]
    np.testing.assert_allclose(got, want, rtol=1e-13)
    # momentum runs opposite to the lr: max 0.95 where the lr is lowest, 0.85 at the peak
    assert moms[0] == 0.95 and min(moms) == pytest.approx(0.85)
    assert np.argmin(moms) == np.argmax(np.array(got)[:, 0])
    with pytest.raises(ValueError, match="Tried to step 41 times"):
        sched.step()
        sched.step()


def test_one_cycle_drives_adam_beta1():
    opt = Adam([Parameter(np.zeros(1))], lr=1.0, betas=(0.5, 0.99))
    OneCycleLR(opt, max_lr=0.1, total_steps=10).step()
    beta1, beta2 = opt.param_groups[0]["betas"]
    assert beta2 == 0.99 and 0.85 < beta1 < 0.95
    with pytest.raises(ValueError, match="momentum or beta1"):
        OneCycleLR(Adagrad([Parameter(np.zeros(1))]), max_lr=1.0, total_steps=5)


def test_sequential_lr_restarts_each_schedule_at_its_milestone():
    opt = sgd()
    sched = SequentialLR(opt, [LinearLR(opt, 0.1, 1.0, 5), CosineAnnealingLR(opt, 10),
                               ExponentialLR(opt, 0.8)], milestones=[5, 15])
    got = lrs_over(sched, 30)

    def ref(b, e):
        if e < 5:
            return b * (0.1 + 0.9 * e / 5)
        if e < 15:
            return cosine(b, 0.0, (e - 5) / 10)
        return b * 0.8 ** (e - 15)
    np.testing.assert_allclose(got, [[ref(b, e) for b in BASES] for e in range(31)],
                               rtol=1e-13, atol=1e-16)


def test_sequential_lr_checks_its_arguments():
    opt = sgd()
    with pytest.raises(ValueError, match="2 schedulers need 1 milestones, got 2"):
        SequentialLR(opt, [ConstantLR(opt), ExponentialLR(opt, 0.9)], milestones=[3, 4])
    with pytest.raises(ValueError, match="another optimizer"):
        SequentialLR(opt, [ConstantLR(opt), ExponentialLR(sgd(), 0.9)], milestones=[3])


def test_reduce_on_plateau_by_hand():
    opt = sgd()
    sched = ReduceLROnPlateau(opt, patience=2, factor=0.5, cooldown=1, min_lr=[0.2, 0.0])
    metrics = [5, 4, 4, 4, 4, 4, 4, 4, 3, 3, 3, 3]
    lrs = []
    for m in metrics:
        sched.step(m)
        lrs.append(sched.get_last_lr()[0])
    # best 4 at epoch 2; bad epochs 3, 4, 5 -> the third (> patience 2) reduces at epoch 5;
    # epoch 6 is cooldown (not counted); bad at 7, 8; new best 3 at 9; bad 10, 11, 12 ->
    # reduce at 12; then cooldown at 13, bad 14, 15, 16 -> reduce, limited by min_lr 0.2
    assert lrs == [1.0] * 4 + [0.5] * 7 + [0.25]
    sched.step(3)
    sched.step(3)
    sched.step(3)
    sched.step(3)
    assert sched.get_last_lr()[0] == 0.2  # max(0.25 * 0.5, 0.2)
    assert sched.get_last_lr()[1] == pytest.approx(0.3 * 0.5 ** 3)


def test_reduce_on_plateau_modes():
    def run(metrics, **kw):
        opt = sgd()
        sched = ReduceLROnPlateau(opt, patience=0, **kw)
        for m in metrics:
            sched.step(m)
        return sched.get_last_lr()[0]
    # max mode: 1.0 -> 1.05 is better by rel threshold 0.01; 1.05 -> 1.06 is not (< 1.0605)
    assert run([1.0, 1.05], mode="max", threshold=0.01) == 1.0
    assert run([1.0, 1.05, 1.06], mode="max", threshold=0.01) == pytest.approx(0.1)
    # abs threshold 0.5 in min mode: 10 -> 9.6 is no improvement, 10 -> 9.4 is
    assert run([10, 9.6], threshold=0.5, threshold_mode="abs") == pytest.approx(0.1)
    assert run([10, 9.4], threshold=0.5, threshold_mode="abs") == 1.0
    with pytest.raises(ValueError, match="Factor should be < 1.0"):
        ReduceLROnPlateau(sgd(), factor=1.0)
    with pytest.raises(ValueError, match="'median' is unknown"):
        ReduceLROnPlateau(sgd(), mode="median")


SAVED = [
    lambda o: MultiStepLR(o, [3, 7], gamma=0.5),
    lambda o: CosineAnnealingWarmRestarts(o, 3, T_mult=2, eta_min=0.01),
    lambda o: OneCycleLR(o, max_lr=1.0, total_steps=30),
    lambda o: LinearLR(o, 0.2, 1.0, 5),
    lambda o: PolynomialLR(o, 12, 1.5),
    lambda o: SequentialLR(o, [LinearLR(o, 0.1, 1.0, 4), CosineAnnealingLR(o, 8)], [4]),
]


@pytest.mark.parametrize("make", SAVED)
def test_state_dict_round_trip_continues_exactly(make):
    whole = lrs_over(make(sgd(momentum=0.9)), 25)
    first = make(sgd(momentum=0.9))
    lrs_over(first, 10)
    state = first.state_dict()
    assert "optimizer" not in state
    opt = sgd(momentum=0.9)
    resumed = make(opt)
    resumed.load_state_dict(state)
    assert resumed.get_last_lr() == list(whole[10])
    assert [g["lr"] for g in opt.param_groups] == list(whole[10])
    np.testing.assert_array_equal(lrs_over(resumed, 15), whole[10:])


def test_reduce_on_plateau_state_round_trip():
    opt = sgd()
    sched = ReduceLROnPlateau(opt, patience=1)
    for m in (3, 2, 2):
        sched.step(m)
    state = sched.state_dict()
    other = ReduceLROnPlateau(sgd(), patience=1)
    other.load_state_dict(state)
    assert (other.best, other.num_bad_epochs, other.last_epoch) == (2.0, 1, 3)
    for m in (2, 5, 5):
        other.step(m)  # bad epochs 2 (> patience: reduced), then 1, 2 (reduced again)
        sched.step(m)
        assert other.get_last_lr() == sched.get_last_lr()
    assert sched.get_last_lr()[0] == pytest.approx(0.01)
    assert other.num_bad_epochs == sched.num_bad_epochs == 0


def test_warm_restarts_take_fractional_epochs_without_warning():
    opt = sgd()
    sched = CosineAnnealingWarmRestarts(opt, T_0=2, T_mult=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sched.step(2.5)  # 0.5 into the second cycle (length 4)
    assert sched.T_i == 4 and sched.T_cur == 0.5 and sched.last_epoch == 2
    assert sched.get_last_lr()[0] == pytest.approx(cosine(1.0, 0.0, 0.5 / 4))


def test_step_with_an_epoch_warns_and_jumps():
    opt = sgd()
    sched = ExponentialLR(opt, 0.5)
    with pytest.warns(UserWarning, match="epoch parameter"):
        sched.step(3)
    assert sched.get_last_lr() == [0.125, 0.3 * 0.125]


@pytest.mark.parametrize("make,match", [
    (lambda o: LinearLR(o, start_factor=0.0), "Starting multiplicative factor"),
    (lambda o: LinearLR(o, end_factor=1.5), "Ending multiplicative factor"),
    (lambda o: ConstantLR(o, factor=2.0), "between 0 and 1, got 2.0"),
    (lambda o: CosineAnnealingLR(o, T_max=0), "T_max must be an int >= 1, got 0"),
    (lambda o: CosineAnnealingWarmRestarts(o, T_0=2, T_mult=0), "T_mult"),
    (lambda o: OneCycleLR(o, max_lr=1.0), "total_steps OR"),
    (lambda o: OneCycleLR(o, max_lr=1.0, total_steps=5, pct_start=1.5), "pct_start"),
    (lambda o: OneCycleLR(o, max_lr=1.0, total_steps=5, anneal_strategy="exp"), "'exp'"),
    (lambda o: OneCycleLR(o, max_lr=[1.0], total_steps=5), "expected 2 values for max_lr"),
    (lambda o: MultiStepLR(o, [2, -1]), "milestone"),
])
def test_argument_validation(make, match):
    with pytest.raises(ValueError, match=match):
        make(sgd(momentum=0.9))
