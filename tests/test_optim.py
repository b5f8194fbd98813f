"""Optimizers, clipping, schedulers vs. float64 references written out here."""
import functools
import math

import numpy as np
import pytest

import spmdnet.kernels
from spmdnet.nn import Parameter
from spmdnet.optim import SGD, Adam, AdamW, clip_grad_norm_
from spmdnet.optim.lr_scheduler import LambdaLR, StepLR, WarmupCosine


@pytest.fixture(autouse=True, params=["numba", "xp"])
def kernels(request):
    """Every test runs on the fused Numba kernels and on the plain-xp path."""
    with spmdnet.kernels.use(request.param):
        yield request.param


def P(data, grad=None):
    """A parameter over ``data`` (not copied) whose ``.grad`` is a Tensor over
    ``grad`` (an array, not copied), as backward leaves it."""
    p = Parameter(data)
    p.grad = grad
    return p


RNG = np.random.default_rng(0)
INIT = [RNG.standard_normal(s) for s in [(3, 4), (5,)]]
GRADS = [[RNG.standard_normal(x.shape) for x in INIT] for _ in range(3)]  # per step


def feed(opt, params, grads, dtype=np.float64):
    for p, g in zip(params, grads):
        p.grad = g.astype(dtype)
    opt.step()


def run(cls, dtype=np.float64, steps=3, **kw):
    """``steps`` updates of ``cls``, with different gradients at each step."""
    params = [P(x.astype(dtype)) for x in INIT]
    buffers = [p.array for p in params]
    opt = cls(params, **kw)
    for grads in GRADS[:steps]:
        feed(opt, params, grads, dtype)
    assert all(p.array is b and b.dtype == dtype for p, b in zip(params, buffers))
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


def ref_adam(i, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, w=False):
    """Adam (L2 decay in the gradient) or, with ``w``, AdamW (decoupled)."""
    (b1, b2), p, m, v = betas, INIT[i].copy(), 0.0, 0.0
    for t, grads in enumerate(GRADS, start=1):
        g = grads[i] if w else grads[i] + weight_decay * p
        p = p * (1 - lr * weight_decay) if w else p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


@pytest.mark.parametrize("cls,kw", [
    (SGD, {"lr": 0.1}), (SGD, {"lr": 0.1, "momentum": 0.9}),
    (SGD, {"lr": 0.1, "weight_decay": 0.05}),
    (SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.3}),
    (SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    (SGD, {"lr": 0.1, "momentum": 0.8, "dampening": 0.2, "weight_decay": 0.05}),
    (SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.05}),
    (Adam, {}), (Adam, {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-3}),
    (Adam, {"lr": 0.01, "weight_decay": 0.1}), (AdamW, {"lr": 0.01}),
    (AdamW, {"lr": 0.01, "weight_decay": 0.3, "eps": 1e-3})])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_update_matches_reference(cls, kw, dtype):
    opt, params = run(cls, dtype=dtype, **kw)
    tol = 1e-10 if dtype == np.float64 else 2e-5
    ref = {SGD: ref_sgd, Adam: ref_adam,  # AdamW's default decay is 1e-2
           AdamW: functools.partial(ref_adam, weight_decay=1e-2, w=True)}[cls]
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.array, ref(i, **kw), rtol=tol, atol=tol)
        assert all(v.dtype == dtype for k, v in opt.state[p].items() if k != "step")
        assert cls is SGD or opt.state[p]["step"] == 3


def test_sgd_momentum_by_hand_and_param_groups():
    p = P(np.array([1.0]))
    opt = SGD([p], lr=0.1, momentum=0.9)
    for g in (1.0, 2.0, 3.0):  # buf: 1, 2.9, 5.61 -> p: 0.9, 0.61, 0.049
        feed(opt, [p], [np.array([g])])
    np.testing.assert_allclose(p.array, [0.049], rtol=1e-12)
    opt, params = run(lambda ps, **kw: SGD(
        [{"params": ps[:1]}, {"params": ps[1:], "lr": 0.01}], **kw),
        lr=0.1, momentum=0.9)  # two param groups, the second with its own lr
    assert opt.param_groups[1]["momentum"] == 0.9
    np.testing.assert_allclose(params[0].array, ref_sgd(0, 0.1, 0.9), rtol=1e-12)
    np.testing.assert_allclose(params[1].array, ref_sgd(1, 0.01, 0.9), rtol=1e-12)


@pytest.mark.parametrize("cls,kw", [
    (SGD, {"lr": 0.1, "weight_decay": 0.1, "momentum": 0.9}),
    (Adam, {"weight_decay": 0.1})])
def test_grads_untouched_buffers_reused_none_grads_skipped(cls, kw):
    a, b = P(INIT[0].copy(), GRADS[0][0].copy()), P(INIT[1].copy())
    opt = cls([a, b], **kw)
    opt.step()
    np.testing.assert_array_equal(a.grad, GRADS[0][0])  # grad + wd*p not in place
    assert b not in opt.state and np.array_equal(b.array, INIT[1])
    arrays = {k: v for k, v in opt.state[a].items() if k != "step"}
    opt.step()  # the same buffers again: no allocation per step
    assert all(opt.state[a][k] is v for k, v in arrays.items())


def test_zero_grad_both_modes_and_closure():
    p, q = P(np.ones(3), np.ones(3)), P(np.ones(2))  # q has no grad
    opt = SGD([p, q], lr=0.1)
    assert opt.step(lambda: 42.0) == 42.0
    grad = p.grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is grad and not grad.any() and q.grad is None
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.parametrize("cls,kw", [
    (SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    (Adam, {"lr": 0.01, "weight_decay": 0.1}), (AdamW, {"lr": 0.01})])
def test_state_dict_round_trip(cls, kw):
    opt, params = run(cls, steps=2, **kw)
    opt.param_groups[0]["lr"] *= 0.5  # as a scheduler would
    sd = opt.state_dict()
    assert sd["param_groups"][0]["params"] == [0, 1]
    saved = [v for st in sd["state"].values() for k, v in st.items() if k != "step"]
    assert saved and all(type(v) is np.ndarray for v in saved)
    assert not any(k.startswith("_") for st in sd["state"].values() for k in st)
    snapshot = [v.copy() for v in saved]
    clones = [P(p.array.copy()) for p in params]
    opt2 = cls(clones, **kw)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    feed(opt, params, GRADS[2])
    feed(opt2, clones, GRADS[2])
    assert all(np.array_equal(p.array, c.array) for p, c in zip(params, clones))
    assert all(np.array_equal(v, v0) for v, v0 in zip(saved, snapshot))  # copies


def test_load_state_dict_validates():
    sd = run(Adam, steps=1)[0].state_dict()
    wrong = Adam([P(np.zeros((4, 3))), P(np.zeros(5))])
    with pytest.raises(ValueError, match=r"parameter 0.*\(3, 4\).*\(4, 3\)"):
        wrong.load_state_dict(sd)
    assert wrong.state == {}  # nothing half-loaded
    with pytest.raises(ValueError, match="has 1 parameter groups"):
        Adam([{"params": [P(np.zeros(1))]} for _ in "ab"]).load_state_dict(sd)
    with pytest.raises(ValueError, match="has 1 parameters"):
        Adam([P(np.zeros((3, 4)))]).load_state_dict(sd)


@pytest.mark.parametrize("make,match", [
    (lambda ps: SGD(ps, lr=-0.1), "-0.1"), (lambda ps: SGD(ps, 0.1, -0.5), "-0.5"),
    (lambda ps: SGD(ps, 0.1, weight_decay=-1.0), "-1.0"),
    (lambda ps: SGD(ps, 0.1, nesterov=True), "Nesterov"),
    (lambda ps: SGD(ps, 0.1, 0.9, dampening=0.1, nesterov=True), "dampening=0.1"),
    (lambda ps: SGD([{"params": ps, "lr": -2.0}], lr=0.1), "-2.0"),
    (lambda ps: Adam(ps, lr=-1e-3), "-0.001"), (lambda ps: AdamW(ps, eps=-1), "-1"),
    (lambda ps: Adam(ps, betas=(1.0, 0.999)), "index 0: 1.0"),
    (lambda ps: Adam(ps, betas=(0.9, -0.1)), "index 1: -0.1"),
    (lambda ps: SGD([], lr=0.1), "empty"), (lambda ps: SGD(ps + ps, 1), "more than"),
    (lambda ps: StepLR(SGD(ps, 0.1), step_size=0), "step_size"),
    (lambda ps: LambdaLR(SGD(ps, 0.1), [abs, abs]), "1 lr_lambdas"),
    (lambda ps: WarmupCosine(SGD(ps, 0.1), 10, 5), "warmup_steps=10"),
    (lambda ps: WarmupCosine(SGD(ps, 0.1), -1, 5), "-1"),
    (lambda ps: WarmupCosine(SGD(ps, 0.1), 1, 5, min_lr=-0.1), "-0.1")])
def test_argument_validation(make, match):
    with pytest.raises(ValueError, match=match):
        make([P(np.zeros(2))])
    with pytest.raises(TypeError, match="single parameter"):
        SGD(P(np.zeros(2)), lr=0.1)


@pytest.mark.parametrize("norm_type", [2.0, math.inf, 1.0])
def test_clip_grad_norm(norm_type):
    params = [P(x.astype(np.float32), g.astype(np.float32)) for x, g in zip(INIT, GRADS[0])]
    before = [p.grad.array.copy() for p in params]
    expected = np.linalg.norm(np.concatenate([g.ravel() for g in before]), norm_type)
    total = clip_grad_norm_(params + [P(np.zeros(2))], 0.5, norm_type)
    assert isinstance(total, float) and total == pytest.approx(expected, rel=1e-5)
    for p, g in zip(params, before):
        assert p.grad.dtype == np.float32
        np.testing.assert_allclose(p.grad, g * 0.5 / (expected + 1e-6), rtol=1e-5)
    after = np.concatenate([p.grad.array.ravel() for p in params])
    assert np.linalg.norm(after, ord=norm_type) == pytest.approx(0.5, rel=1e-4)
    g = np.array([3.0, 4.0])  # under the max, and a single parameter
    p = P(np.zeros(2), g)
    assert clip_grad_norm_(p, 10.0) == pytest.approx(5.0)
    assert p.grad.array is g and np.array_equal(g, [3.0, 4.0])
    assert clip_grad_norm_([P(np.zeros(2))], 1.0) == 0.0


def lrs_over(sched, n=20):
    """Per-group lrs at epochs 0..n-1 (the constructor already did epoch 0)."""
    out = [sched.get_last_lr()]
    for _ in range(n - 1):
        sched.step()
        out.append(sched.get_last_lr())
    assert out[-1] == [g["lr"] for g in sched.optimizer.param_groups]
    return np.array(out)


def two_groups(lrs=(0.1, 0.02)):
    return SGD([{"params": [P(np.zeros(1))], "lr": lr} for lr in lrs], lr=1.0)


def cosine_ref(b, e, w=4, t=16, lo=1e-3):
    cos = lo + 0.5 * (b - lo) * (1 + math.cos(math.pi * (e - w) / (t - w)))
    return b * (e + 1) / w if e < w else cos if e < t else lo


SCHEDULES = [  # (scheduler factory, closed form lr(base, epoch))
    (lambda o: StepLR(o, 3, gamma=0.5), lambda b, e: b * 0.5 ** (e // 3)),
    (lambda o: LambdaLR(o, lambda e: 0.9 ** e), lambda b, e: b * 0.9 ** e),
    (lambda o: LambdaLR(o, [lambda e: 1 / (e + 1), lambda e: e]),
     lambda b, e: b / (e + 1) if b == 0.1 else b * e),
    (lambda o: WarmupCosine(o, 4, 16, min_lr=1e-3), cosine_ref)]


@pytest.mark.parametrize("make,closed", SCHEDULES)
def test_schedules_match_closed_forms(make, closed):
    opt = two_groups()
    ref = [[closed(b, e) for b in (0.1, 0.02)] for e in range(20)]
    np.testing.assert_allclose(lrs_over(make(opt)), ref, rtol=1e-14)
    assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.02]
    # warmup 0.1/4 .. 0.1, then the cosine is halfway at epoch 10, then min_lr
    got = [cosine_ref(0.1, e) for e in (0, 3, 4, 10, 16, 19)]
    assert got == pytest.approx([0.025, 0.1, 0.1, 0.0505, 1e-3, 1e-3], rel=1e-12)


@pytest.mark.parametrize("make", [m for m, _ in SCHEDULES])
def test_scheduler_state_dict_round_trip(make):
    opt = two_groups()
    sched = make(opt)
    lrs_over(sched, 8)  # to epoch 7
    opt2 = two_groups((5.0, 5.0))  # the lrs must come back from the checkpoints
    sched2 = make(opt2)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    assert sched2.last_epoch == 7 and sched2.get_last_lr() == sched.get_last_lr()
    np.testing.assert_array_equal(lrs_over(sched2, 10), lrs_over(sched, 10))
