"""Optimizers, clipping and schedulers against float64 references written
out plainly here (never by calling the library), on stand-in parameters so
these tests do not depend on spmdnet.nn."""
import math
import pathlib

import numpy as np
import pytest

from spmdnet import optim
from spmdnet.optim import lr_scheduler


class P:
    """Minimal parameter: what optimizers are allowed to rely on."""

    def __init__(self, data, grad=None):
        self.data, self.grad, self.requires_grad = data, grad, True


RNG = np.random.default_rng(0)
INIT = [RNG.standard_normal(s) for s in [(3, 4), (5,)]]
GRADS = [[RNG.standard_normal(x.shape) for x in INIT] for _ in range(3)]  # per step


def run(cls, dtype=np.float64, steps=3, **kw):
    """``steps`` updates of ``cls`` with different gradients at each step."""
    params = [P(x.astype(dtype)) for x in INIT]
    buffers = [p.data for p in params]
    opt = cls(params, **kw)
    for grads in GRADS[:steps]:
        for p, g in zip(params, grads):
            p.grad = g.astype(dtype)
        opt.step()
    for p, buf in zip(params, buffers):
        assert p.data is buf and p.data.dtype == dtype  # in place, dtype kept
    return opt, params


def ref_sgd(i, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    p, buf = INIT[i].copy(), None
    for grads in GRADS:
        d = grads[i] + weight_decay * p
        if momentum:
            buf = d.copy() if buf is None else momentum * buf + (1 - dampening) * d
            d = d + momentum * buf if nesterov else buf
        p = p - lr * d
    return p


def ref_adam(i, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, adamw=False):
    (b1, b2), p, m, v = betas, INIT[i].copy(), 0.0, 0.0
    for t, grads in enumerate(GRADS, start=1):
        g = grads[i]
        if adamw:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


@pytest.mark.parametrize("kw", [
    {"lr": 0.1}, {"lr": 0.1, "momentum": 0.9},
    {"lr": 0.1, "momentum": 0.9, "dampening": 0.3},
    {"lr": 0.1, "momentum": 0.9, "nesterov": True}, {"lr": 0.1, "weight_decay": 0.05},
    {"lr": 0.1, "momentum": 0.8, "dampening": 0.2, "weight_decay": 0.05},
    {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.05}])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sgd_matches_reference(kw, dtype):
    opt, params = run(optim.SGD, dtype=dtype, **kw)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.data, ref_sgd(i, **kw), rtol=tol, atol=tol)
        assert all(v.dtype == dtype for v in opt.state[p].values())


def test_sgd_momentum_by_hand():
    p = P(np.array([1.0]))
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    for g in (1.0, 2.0, 3.0):  # buf: 1, 2.9, 5.61 -> p: 0.9, 0.61, 0.049
        p.grad = np.array([g])
        opt.step()
    np.testing.assert_allclose(p.data, [0.049], rtol=1e-12)


@pytest.mark.parametrize("cls,kw", [
    (optim.Adam, {}), (optim.Adam, {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-3}),
    (optim.Adam, {"lr": 0.01, "weight_decay": 0.1}), (optim.AdamW, {"lr": 0.01}),
    (optim.AdamW, {"lr": 0.01, "weight_decay": 0.3, "eps": 1e-3})])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_adam_matches_reference(cls, kw, dtype):
    opt, params = run(cls, dtype=dtype, **kw)
    tol = 1e-10 if dtype == np.float64 else 2e-5
    ref_kw = {"weight_decay": 1e-2, "adamw": True, **kw} if cls is optim.AdamW else kw
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.data, ref_adam(i, **ref_kw), rtol=tol, atol=tol)
        assert opt.state[p]["step"] == 3 and opt.state[p]["exp_avg"].dtype == dtype


def test_grads_untouched_scratch_kept_none_grads_skipped():
    for cls, kw in ((optim.SGD, {"lr": 0.1, "weight_decay": 0.1, "momentum": 0.9}),
                    (optim.Adam, {"weight_decay": 0.1})):
        a, b = P(INIT[0].copy(), GRADS[0][0].copy()), P(INIT[1].copy())
        opt = cls([a, b], **kw)
        opt.step()
        np.testing.assert_array_equal(a.grad, GRADS[0][0])  # g+wd*p not in place
        assert b not in opt.state and np.array_equal(b.data, INIT[1])
        arrays = {k: v for k, v in opt.state[a].items() if k != "step"}
        opt.step()  # the same buffers are reused: no allocation per step
        assert all(opt.state[a][k] is v for k, v in arrays.items())


def test_param_groups_with_different_lr():
    params = [P(x.copy()) for x in INIT]
    opt = optim.SGD([{"params": [params[0]]}, {"params": [params[1]], "lr": 0.01}],
                    lr=0.1, momentum=0.9)
    assert opt.param_groups[1]["momentum"] == 0.9
    for grads in GRADS:
        for p, g in zip(params, grads):
            p.grad = g.copy()
        opt.step()
    np.testing.assert_allclose(params[0].data, ref_sgd(0, 0.1, 0.9), rtol=1e-12)
    np.testing.assert_allclose(params[1].data, ref_sgd(1, 0.01, 0.9), rtol=1e-12)


def test_zero_grad_both_modes_and_closure():
    p, q = P(np.ones(3), np.ones(3)), P(np.ones(2))  # q has no grad
    opt = optim.SGD([p, q], lr=0.1)
    assert opt.step(lambda: 42.0) == 42.0
    grad = p.grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is grad and not grad.any() and q.grad is None
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.parametrize("cls,kw", [
    (optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    (optim.Adam, {"lr": 0.01, "weight_decay": 0.1}), (optim.AdamW, {"lr": 0.01})])
def test_state_dict_round_trip(cls, kw):
    opt, params = run(cls, steps=2, **kw)
    opt.param_groups[0]["lr"] *= 0.5  # as a scheduler would
    sd = opt.state_dict()
    assert sd["param_groups"][0]["params"] == [0, 1]
    saved = [v for st in sd["state"].values() for k, v in st.items() if k != "step"]
    assert saved and all(isinstance(v, np.ndarray) for v in saved)
    assert not any(k.startswith("_") for st in sd["state"].values() for k in st)
    clones = [P(p.data.copy()) for p in params]
    opt2 = cls(clones, **kw)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    for o, ps in ((opt, params), (opt2, clones)):
        for p, g in zip(ps, GRADS[2]):
            p.grad = g.copy()
        o.step()
    for p, c in zip(params, clones):
        np.testing.assert_array_equal(p.data, c.data)
    arrays = [p.data for p in params + clones]
    arrays += [v for o in (opt, opt2) for st in o.state.values() for v in st.values()
               if isinstance(v, np.ndarray)]
    assert not any(np.shares_memory(s, a) for s in saved for a in arrays)


def test_load_state_dict_validates():
    sd = run(optim.Adam, steps=1)[0].state_dict()
    wrong = optim.Adam([P(np.zeros((4, 3))), P(np.zeros(5))])
    with pytest.raises(ValueError, match=r"parameter 0.*\(3, 4\).*\(4, 3\)"):
        wrong.load_state_dict(sd)
    assert wrong.state == {}  # nothing half-loaded
    with pytest.raises(ValueError, match="has 1 parameter groups"):
        optim.Adam([{"params": [P(np.zeros(1))]} for _ in "ab"]).load_state_dict(sd)
    with pytest.raises(ValueError, match="has 1 parameters"):
        optim.Adam([P(np.zeros((3, 4)))]).load_state_dict(sd)


@pytest.mark.parametrize("make,match", [
    (lambda ps: optim.SGD(ps, lr=-0.1), "-0.1"),
    (lambda ps: optim.SGD(ps, lr=0.1, momentum=-0.5), "-0.5"),
    (lambda ps: optim.SGD(ps, lr=0.1, weight_decay=-1.0), "-1.0"),
    (lambda ps: optim.SGD(ps, lr=0.1, nesterov=True), "Nesterov"),
    (lambda ps: optim.SGD(ps, 0.1, 0.9, dampening=0.1, nesterov=True), "dampening=0.1"),
    (lambda ps: optim.SGD([{"params": ps, "lr": -2.0}], lr=0.1), "-2.0"),
    (lambda ps: optim.Adam(ps, lr=-1e-3), "-0.001"),
    (lambda ps: optim.Adam(ps, betas=(1.0, 0.999)), "index 0: 1.0"),
    (lambda ps: optim.Adam(ps, betas=(0.9, -0.1)), "index 1: -0.1"),
    (lambda ps: optim.AdamW(ps, eps=-1e-8), "-1e-08"),
    (lambda ps: optim.SGD([], lr=0.1), "empty"),
    (lambda ps: optim.SGD(ps + ps, lr=0.1), "more than once"),
    (lambda ps: lr_scheduler.StepLR(optim.SGD(ps, 0.1), step_size=0), "step_size"),
    (lambda ps: lr_scheduler.LambdaLR(optim.SGD(ps, 0.1), [abs, abs]), "1 lr_lambdas"),
    (lambda ps: lr_scheduler.WarmupCosine(optim.SGD(ps, 0.1), 10, 5), "steps=10"),
    (lambda ps: lr_scheduler.WarmupCosine(optim.SGD(ps, 0.1), -1, 5), "-1"),
    (lambda ps: lr_scheduler.WarmupCosine(optim.SGD(ps, 0.1), 1, 5, -0.1), "-0.1")])
def test_hyperparameter_validation(make, match):
    with pytest.raises(ValueError, match=match):
        make([P(np.zeros(2))])
    with pytest.raises(TypeError, match="single parameter"):
        optim.SGD(P(np.zeros(2)), lr=0.1)


@pytest.mark.parametrize("norm_type", [2.0, math.inf, 1.0])
def test_clip_grad_norm(norm_type):
    params = [P(x.copy(), g.astype(np.float32)) for x, g in zip(INIT, GRADS[0])]
    before = [p.grad.copy() for p in params]
    flat = np.concatenate([g.ravel().astype(np.float64) for g in before])
    expected = np.linalg.norm(flat, ord=norm_type)
    total = optim.clip_grad_norm_(params + [P(np.zeros(2))], 0.5, norm_type)
    assert isinstance(total, float) and total == pytest.approx(expected, rel=1e-5)
    for p, g in zip(params, before):
        assert p.grad.dtype == np.float32
        np.testing.assert_allclose(p.grad, g * 0.5 / (expected + 1e-6), rtol=1e-5)
    after = np.concatenate([p.grad.ravel() for p in params])
    assert np.linalg.norm(after, ord=norm_type) == pytest.approx(0.5, rel=1e-4)


def test_clip_grad_norm_under_max_and_single_parameter():
    g = np.array([3.0, 4.0])
    p = P(np.zeros(2), g)
    assert optim.clip_grad_norm_(p, 10.0) == pytest.approx(5.0)
    assert p.grad is g and np.array_equal(g, [3.0, 4.0])
    assert optim.clip_grad_norm_([P(np.zeros(2))], 1.0) == 0.0


def lrs_over(sched, n=20):
    """Per-group lrs at epochs 0..n-1 (the constructor already did epoch 0)."""
    out = [sched.get_last_lr()]
    for _ in range(n - 1):
        sched.step()
        out.append(sched.get_last_lr())
    assert out[-1] == [g["lr"] for g in sched.optimizer.param_groups]
    return np.array(out)


def two_groups(lrs=(0.1, 0.02)):
    return optim.SGD([{"params": [P(np.zeros(1))], "lr": lr} for lr in lrs], lr=1.0)


def cosine_ref(b, e, w=4, t=16, lo=1e-3):
    if e < w:
        return b * (e + 1) / w
    if e >= t:
        return lo
    return lo + 0.5 * (b - lo) * (1 + math.cos(math.pi * (e - w) / (t - w)))


SCHEDULES = [  # (scheduler factory, closed form lr(base, epoch))
    (lambda o: lr_scheduler.StepLR(o, 3, gamma=0.5), lambda b, e: b * 0.5 ** (e // 3)),
    (lambda o: lr_scheduler.LambdaLR(o, lambda e: 0.9 ** e), lambda b, e: b * 0.9 ** e),
    (lambda o: lr_scheduler.LambdaLR(o, [lambda e: 1 / (e + 1), lambda e: e]),
     lambda b, e: b / (e + 1) if b == 0.1 else b * e),
    (lambda o: lr_scheduler.WarmupCosine(o, 4, 16, min_lr=1e-3), cosine_ref)]


@pytest.mark.parametrize("make,closed", SCHEDULES)
def test_schedules_match_closed_forms(make, closed):
    opt = two_groups()
    got = lrs_over(make(opt))
    ref = [[closed(b, e) for b in (0.1, 0.02)] for e in range(20)]
    np.testing.assert_allclose(got, ref, rtol=1e-14)
    assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.02]


def test_warmup_cosine_landmarks():
    lrs = lrs_over(lr_scheduler.WarmupCosine(two_groups(), 4, 16, min_lr=1e-3))[:, 0]
    assert lrs[0] == pytest.approx(0.1 / 4) and lrs[3] == lrs[4] == 0.1
    assert lrs[10] == pytest.approx((0.1 + 1e-3) / 2)  # halfway through the decay
    assert all(lrs[16:] == 1e-3)


@pytest.mark.parametrize("make", [m for m, _ in SCHEDULES])
def test_scheduler_state_dict_round_trip(make):
    opt = two_groups()
    sched = make(opt)
    for _ in range(7):
        sched.step()
    opt2 = two_groups((5.0, 5.0))  # lrs come back from the checkpoints
    sched2 = make(opt2)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    assert sched2.last_epoch == 7 and sched2.get_last_lr() == sched.get_last_lr()
    np.testing.assert_array_equal(lrs_over(sched2, 10), lrs_over(sched, 10))


def test_optim_never_imports_mpi4py():
    src = pathlib.Path(optim.__file__).parent
    assert not any("mpi4py" in f.read_text() for f in src.glob("*.py"))
