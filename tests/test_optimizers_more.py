"""Adagrad, Adadelta, RMSprop, NAdam, RAdam, amsgrad and maximize against
PyTorch's documented update equations, written out here in float64."""
import math

import numpy as np
import pytest

import spmdnet.kernels
from spmdnet.nn import Parameter
from spmdnet.optim import SGD, Adadelta, Adagrad, Adam, AdamW, NAdam, RAdam, RMSprop

RNG = np.random.default_rng(7)
INIT = [RNG.standard_normal(s) for s in [(3, 4), (5,)]]
STEPS = 8  # RAdam's rectification switches on at step 6 with the default betas
GRADS = [[RNG.standard_normal(x.shape) for x in INIT] for _ in range(STEPS)]


@pytest.fixture(autouse=True, params=["numba", "xp"])
def kernels(request):
    """Every test runs with the fused kernels allowed and with plain xp."""
    with spmdnet.kernels.use(request.param):
        yield request.param


def run(cls, dtype=np.float64, **kw):
    params = [Parameter(x.astype(dtype)) for x in INIT]
    buffers = [p.array for p in params]
    opt = cls(params, **kw)
    for grads in GRADS:
        for p, g in zip(params, grads):
            p.grad = g.astype(dtype)
        opt.step()
    assert all(p.array is b and b.dtype == dtype for p, b in zip(params, buffers))
    return opt, params


# -- the references: one parameter, all steps, plain float64 formulas -----------------------
def descent_grad(g, p, lr, weight_decay, maximize, decoupled=False):
    """(gradient used, parameter after decoupled decay)."""
    g = -g if maximize else g
    if decoupled:
        return g, p * (1 - lr * weight_decay)
    return g + weight_decay * p, p


def ref_adagrad(i, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0,
                eps=1e-10, maximize=False):
    p, s = INIT[i].copy(), np.full(INIT[i].shape, initial_accumulator_value)
    for t, grads in enumerate(GRADS, start=1):
        g, p = descent_grad(grads[i], p, lr, weight_decay, maximize)
        s = s + g * g
        p = p - lr / (1 + (t - 1) * lr_decay) * g / (np.sqrt(s) + eps)
    return p


def ref_adadelta(i, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False):
    p, v, u = INIT[i].copy(), 0.0, 0.0
    for grads in GRADS:
        g, p = descent_grad(grads[i], p, lr, weight_decay, maximize)
        v = rho * v + (1 - rho) * g ** 2
        delta = np.sqrt(u + eps) / np.sqrt(v + eps) * g
        u = rho * u + (1 - rho) * delta ** 2
        p = p - lr * delta
    return p


def ref_rmsprop(i, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                centered=False, maximize=False):
    p, v, a, buf = INIT[i].copy(), 0.0, 0.0, 0.0
    for grads in GRADS:
        g, p = descent_grad(grads[i], p, lr, weight_decay, maximize)
        v = alpha * v + (1 - alpha) * g ** 2
        if centered:
            a = alpha * a + (1 - alpha) * g
            avg = np.sqrt(v - a ** 2) + eps
        else:
            avg = np.sqrt(v) + eps
        if momentum > 0:
            buf = momentum * buf + g / avg
            p = p - lr * buf
        else:
            p = p - lr * g / avg
    return p


def ref_adam(i, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False,
             maximize=False, decoupled=False):
    (b1, b2), p, m, v, vmax = betas, INIT[i].copy(), 0.0, 0.0, 0.0
    for t, grads in enumerate(GRADS, start=1):
        g, p = descent_grad(grads[i], p, lr, weight_decay, maximize, decoupled)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        vmax = np.maximum(vmax, v) if amsgrad else v
        p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(vmax / (1 - b2 ** t)) + eps)
    return p


def ref_nadam(i, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
              momentum_decay=4e-3, decoupled=False, maximize=False):
    (b1, b2), p, m, v, mu_product = betas, INIT[i].copy(), 0.0, 0.0, 1.0
    for t, grads in enumerate(GRADS, start=1):
        g, p = descent_grad(grads[i], p, lr, weight_decay, maximize, decoupled)
        mu = b1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))
        mu_next = b1 * (1 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
        mu_product *= mu
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        v_hat = v / (1 - b2 ** t)
        m_bar = (1 - mu) * g / (1 - mu_product) + mu_next * m / (1 - mu_product * mu_next)
        p = p - lr * m_bar / (np.sqrt(v_hat) + eps)
    return p


def ref_radam(i, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False,
              maximize=False):
    (b1, b2), p, m, v = betas, INIT[i].copy(), 0.0, 0.0
    rho_inf = 2 / (1 - b2) - 1
    for t, grads in enumerate(GRADS, start=1):
        g, p = descent_grad(grads[i], p, lr, weight_decay, maximize, decoupled)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1 ** t)
        rho_t = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
        if rho_t > 5:
            l_t = np.sqrt(1 - b2 ** t) / (np.sqrt(v) + eps)
            r_t = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf
                            / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            p = p - lr * m_hat * l_t * r_t
        else:
            p = p - lr * m_hat
    return p


def ref_sgd_maximize(i, lr, momentum, maximize):
    assert maximize
    p, buf = INIT[i].copy(), None
    for grads in GRADS:
        g = -grads[i]
        buf = g if buf is None else momentum * buf + g
        p = p - lr * buf
    return p


CASES = [
    (Adagrad, {}, ref_adagrad),
    (Adagrad, {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.1,
               "initial_accumulator_value": 0.3, "maximize": True}, ref_adagrad),
    (Adadelta, {}, ref_adadelta),
    (Adadelta, {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1, "maximize": True},
     ref_adadelta),
    (RMSprop, {}, ref_rmsprop),
    (RMSprop, {"momentum": 0.9}, ref_rmsprop),
    (RMSprop, {"centered": True, "weight_decay": 0.05}, ref_rmsprop),
    (RMSprop, {"lr": 3e-3, "alpha": 0.9, "momentum": 0.5, "centered": True, "maximize": True},
     ref_rmsprop),
    (NAdam, {}, ref_nadam),
    (NAdam, {"lr": 1e-2, "weight_decay": 0.1, "momentum_decay": 0.01}, ref_nadam),
    (NAdam, {"weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True},
     lambda i, decoupled_weight_decay, **kw: ref_nadam(i, decoupled=True, **kw)),
    (RAdam, {}, ref_radam),
    (RAdam, {"betas": (0.8, 0.9), "weight_decay": 0.1}, ref_radam),
    (RAdam, {"betas": (0.8, 0.9), "weight_decay": 0.1, "decoupled_weight_decay": True,
             "maximize": True},
     lambda i, decoupled_weight_decay, **kw: ref_radam(i, decoupled=True, **kw)),
    (Adam, {"amsgrad": True}, ref_adam),
    (Adam, {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1, "maximize": True}, ref_adam),
    (Adam, {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True},
     lambda i, decoupled_weight_decay, **kw: ref_adam(i, decoupled=True, **kw)),
    (AdamW, {"lr": 0.01, "amsgrad": True, "maximize": True},
     lambda i, **kw: ref_adam(i, decoupled=True, weight_decay=1e-2, **kw)),
    (SGD, {"lr": 0.1, "momentum": 0.9, "maximize": True}, ref_sgd_maximize),
]


@pytest.mark.parametrize("cls,kw,ref", CASES)
def test_updates_match_documented_equations(cls, kw, ref):
    _, params = run(cls, **kw)
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.array, ref(i, **kw), rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("cls,kw,ref", CASES)
def test_float32_stays_float32_and_close(cls, kw, ref):
    _, params = run(cls, dtype=np.float32, **kw)
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.array, ref(i, **kw), rtol=2e-4, atol=2e-5)


def test_radam_switches_to_the_rectified_step():
    """With betas (0.9, 0.999), rho_t first exceeds 5 at step 6: the first five
    steps are SGD with momentum on m_hat, independent of v."""
    b2 = 0.999
    rho_inf = 2 / (1 - b2) - 1
    rho = [rho_inf - 2 * t * b2 ** t / (1 - b2 ** t) for t in range(1, 8)]
    assert [r > 5 for r in rho] == [False] * 5 + [True] * 2
    p = Parameter(np.zeros(1))
    opt = RAdam([p], lr=1.0)
    p.grad = np.ones(1)
    opt.step()  # m_hat = 1 exactly: p = -lr
    assert p.array.tolist() == [-1.0]


STATE_KEYS = [
    (Adagrad, {}, {"step", "sum"}),
    (Adadelta, {}, {"step", "square_avg", "acc_delta"}),
    (RMSprop, {}, {"step", "square_avg"}),
    (RMSprop, {"momentum": 0.9, "centered": True},
     {"step", "square_avg", "momentum_buffer", "grad_avg"}),
    (NAdam, {}, {"step", "mu_product", "exp_avg", "exp_avg_sq"}),
    (RAdam, {}, {"step", "exp_avg", "exp_avg_sq"}),
    (Adam, {"amsgrad": True}, {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}),
]


@pytest.mark.parametrize("cls,kw,keys", STATE_KEYS)
def test_state_dict_keys_and_resume(cls, kw, keys):
    """PyTorch's state keys; a state saved after 4 steps and loaded into a new
    optimizer continues exactly as the uninterrupted run."""
    opt, params = run(cls, **kw)
    sd = opt.state_dict()
    assert set(sd["state"][0]) == keys and sd["state"][0]["step"] == STEPS
    assert {"foreach", "differentiable", "maximize"} <= set(sd["param_groups"][0])

    half = [Parameter(x.copy()) for x in INIT]
    first = cls(half, **kw)
    for grads in GRADS[:4]:
        for p, g in zip(half, grads):
            p.grad = g.copy()
        first.step()
    resumed = [Parameter(p.array.copy()) for p in half]
    second = cls(resumed, **kw)
    second.load_state_dict(first.state_dict())
    for grads in GRADS[4:]:
        for p, g in zip(resumed, grads):
            p.grad = g.copy()
        second.step()
    for p, q in zip(resumed, params):
        np.testing.assert_array_equal(p.array, q.array)


def test_adagrad_state_exists_before_the_first_step():
    opt = Adagrad([Parameter(np.zeros(3))], initial_accumulator_value=0.5)
    state = opt.state_dict()["state"][0]
    assert state["step"] == 0 and state["sum"].tolist() == [0.5] * 3


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW, Adagrad, Adadelta, RMSprop, NAdam, RAdam])
def test_foreach_and_fused_change_no_number(cls):
    _, plain = run(cls, lr=0.01)
    _, foreach = run(cls, lr=0.01, foreach=True)
    for a, b in zip(plain, foreach):
        np.testing.assert_array_equal(a.array, b.array)
    if cls in (SGD, Adam, AdamW, Adagrad):
        _, fused = run(cls, lr=0.01, fused=True)
        for a, b in zip(plain, fused):
            np.testing.assert_array_equal(a.array, b.array)
        with pytest.raises(RuntimeError, match="cannot be `True` together"):
            cls([Parameter(np.zeros(2))], foreach=True, fused=True)


@pytest.mark.parametrize("cls,flag", [
    (SGD, "differentiable"), (Adam, "capturable"), (AdamW, "differentiable"),
    (Adagrad, "differentiable"), (Adadelta, "capturable"), (RMSprop, "capturable"),
    (NAdam, "differentiable"), (RAdam, "capturable")])
def test_differentiable_and_capturable_true_raise(cls, flag):
    cls([Parameter(np.zeros(2))], **{flag: False})  # accepted
    with pytest.raises(NotImplementedError, match=f"{cls.__name__}\\({flag}=True\\)"):
        cls([Parameter(np.zeros(2))], **{flag: True})


@pytest.mark.parametrize("make,match", [
    (lambda ps: Adagrad(ps, lr_decay=-1), "lr_decay"),
    (lambda ps: Adagrad(ps, initial_accumulator_value=-0.1), "initial_accumulator_value"),
    (lambda ps: Adadelta(ps, rho=1.5), "rho value: 1.5"),
    (lambda ps: RMSprop(ps, alpha=-0.5), "alpha value: -0.5"),
    (lambda ps: RMSprop(ps, momentum=-1), "momentum"),
    (lambda ps: NAdam(ps, momentum_decay=-1), "momentum_decay"),
    (lambda ps: NAdam(ps, betas=(0.9, 1.0)), "beta parameter at index 1: 1.0"),
    (lambda ps: RAdam(ps, eps=-1), "eps"),
])
def test_argument_validation(make, match):
    with pytest.raises(ValueError, match=match):
        make([Parameter(np.zeros(2))])


def test_amsgrad_uses_the_largest_second_moment_by_hand():
    """A large gradient then zeros: without amsgrad v decays and the step
    grows; with it, the denominator keeps the peak."""
    lr, b1, b2 = 1.0, 0.5, 0.5
    steps = {}
    for amsgrad in (False, True):
        p = Parameter(np.zeros(1))
        opt = Adam([p], lr=lr, betas=(b1, b2), eps=0.0, amsgrad=amsgrad)
        for g in (4.0, 0.0):
            p.grad = np.array([g])
            before = p.array.copy()
            opt.step()
        steps[amsgrad] = float(before[0] - p.array[0])
    # step 2: m = 1, v = 4 (amsgrad: max(8, 4) = 8), bc1 = .75, bc2 = .75
    assert steps[False] == pytest.approx((1 / 0.75) / math.sqrt(4 / 0.75))
    assert steps[True] == pytest.approx((1 / 0.75) / math.sqrt(8 / 0.75))
