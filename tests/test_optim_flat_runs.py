"""Optimizers step on flat parameter storage in one call per run
(``optim._flat_runs``): parameters that are adjacent views of one flat array
(``ParamAndGradBuffer(flat_params=True)``), with gradients adjacent views
of one flat gradient array, are updated by one call of the optimizer's
update instead of one per parameter.

The oracle is the per-parameter path: a copy of the model whose parameters
and gradients are separate arrays, stepped by the same optimizer with the
same gradients. Updates are elementwise, so the parameters and every state
entry must agree bit for bit, step after step, through gradients dropped by
``zero_grad(set_to_none=True)``, a parameter without a gradient, a
checkpoint round trip and storage replaced under the optimizer.
"""
import copy

import numpy as np
import pytest

import spmdnet as sn
from spmdnet import kernels, nn, optim
from spmdnet.parallel._common.grad_buffer import ParamAndGradBuffer

CONFIGS = {
    "sgd": (optim.SGD, {"lr": 0.1}),
    "sgd-momentum-dampening": (optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.2}),
    "sgd-nesterov-decay": (optim.SGD, {"lr": 0.05, "momentum": 0.8, "nesterov": True,
                                       "weight_decay": 0.01}),
    "sgd-maximize": (optim.SGD, {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.1,
                                 "maximize": True}),
    "adam": (optim.Adam, {"lr": 0.01}),
    "adam-l2-amsgrad-maximize": (optim.Adam, {"lr": 0.01, "weight_decay": 0.1,
                                              "amsgrad": True, "maximize": True}),
    "adamw-amsgrad": (optim.AdamW, {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}),
    "nadam": (optim.NAdam, {"lr": 0.01, "weight_decay": 0.01}),
    "radam": (optim.RAdam, {"lr": 0.01, "decoupled_weight_decay": True,
                            "weight_decay": 0.01}),
    "adagrad": (optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01,
                                "initial_accumulator_value": 0.1}),
    "adadelta": (optim.Adadelta, {"weight_decay": 0.01}),
    "rmsprop": (optim.RMSprop, {"lr": 0.01, "momentum": 0.9, "centered": True}),
}
FUSED = [k for k in CONFIGS if k.startswith(("sgd", "adam"))]  # a Numba kernel and xp code


def mlp(dtype):
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 6), nn.Tanh(),
                          nn.Linear(6, 3))
    return model.to(dtype=sn.float64 if dtype == np.float64 else sn.float32)


def flat_copy(model):
    """A copy of ``model`` whose parameters are views of one flat array
    (the buffer's) and whose gradients will be views of one flat array."""
    flat = copy.deepcopy(model)
    params = list(flat.parameters())
    buffer = ParamAndGradBuffer(params, [n for n, _ in flat.named_parameters()], None,
                                who="test", flat_params=True)
    (grad_flat,) = [np.zeros_like(f) for f in buffer.param_flats.values()]
    views, offset = [], 0
    for p in params:
        views.append(grad_flat[offset:offset + p.array.size].reshape(p.array.shape))
        offset += p.array.size
    return flat, buffer, views


def give_grads(ref_params, params, views, skip=()):
    """The reference's gradients to both models; the flat model's in its views;
    parameters at ``skip`` get none in either."""
    for i, (r, p, view) in enumerate(zip(ref_params, params, views)):
        if i in skip:
            r.grad = p.grad = None
        else:
            view[...] = r.grad.array
            p.grad = sn.Tensor(view)


def backward(model, rng, dtype):
    x = sn.tensor(rng.standard_normal((4, 5)).astype(dtype))
    (model(x) ** 2).sum().backward()


def counting(opt):
    """Record the sizes of the arrays each update call gets."""
    calls, update = [], opt._update

    def counted(data, grad, state, *args):
        calls.append(data.size)
        return update(data, grad, state, *args)
    opt._update = counted
    return calls


def assert_same(ref_opt, opt, ref_params, params):
    for r, p in zip(ref_params, params):
        assert r.array.dtype == p.array.dtype
        np.testing.assert_array_equal(p.array, r.array, strict=True)
    ref_sd, sd = ref_opt.state_dict(), opt.state_dict()
    assert ref_sd["param_groups"] == sd["param_groups"]
    assert ref_sd["state"].keys() == sd["state"].keys()
    for i, ref_st in ref_sd["state"].items():
        assert ref_st.keys() == sd["state"][i].keys()
        for k, v in ref_st.items():
            if isinstance(v, np.ndarray):
                np.testing.assert_array_equal(sd["state"][i][k], v, strict=True)
            else:
                assert type(sd["state"][i][k]) is type(v) and sd["state"][i][k] == v, (i, k)


def train(name, dtype, steps=6, skip_at=3, skip=(2,)):
    cls, kwargs = CONFIGS[name]
    ref = mlp(dtype)
    flat, buffer, views = flat_copy(ref)
    ref_params, params = list(ref.parameters()), list(flat.parameters())
    ref_opt, opt = cls(ref_params, **kwargs), cls(params, **kwargs)
    ref_calls, calls = counting(ref_opt), counting(opt)
    rng = np.random.default_rng(1)
    total = sum(p.array.size for p in params)
    for step in range(steps):
        ref_opt.zero_grad(set_to_none=True)
        opt.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in params)
        backward(ref, rng, dtype)
        give_grads(ref_params, params, views, skip if step == skip_at else ())
        del ref_calls[:], calls[:]
        ref_opt.step()
        opt.step()
        assert_same(ref_opt, opt, ref_params, params)
        assert len(ref_calls) == (len(params) - (len(skip) if step == skip_at else 0))
        if step < skip_at:
            assert calls == [total]  # the whole model in one call
    # after the skipped step the skipped parameter's state lags: it steps alone,
    # its neighbours in runs
    assert len(calls) < len(ref_calls)
    return ref_opt, opt, ref_params, params, views, buffer


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_runs_match_per_parameter_steps_bit_for_bit(name, dtype):
    train(name, dtype)


@pytest.mark.parametrize("name", FUSED)
def test_the_xp_code_steps_runs_alike(name):
    with kernels.use("xp"):
        train(name, np.float32, steps=4, skip_at=2)


@pytest.mark.parametrize("name", ["sgd-momentum-dampening", "adamw-amsgrad", "nadam"])
def test_a_checkpoint_round_trips_and_loads_into_the_flat_state(name):
    ref_opt, opt, ref_params, params, views, _ = train(name, np.float64, steps=3, skip_at=9)
    saved = opt.state_dict()
    # loading writes into the run's flat state arrays: they stay adjacent views
    keys = [k for k, v in opt.state[params[0]].items() if isinstance(v, np.ndarray)]
    before = {k: [opt.state[p][k] for p in params] for k in keys}
    perturbed = copy.deepcopy(saved)
    for st in perturbed["state"].values():
        for k in keys:
            st[k] = st[k] * 0.5
    opt.load_state_dict(perturbed)
    ref_opt.load_state_dict(perturbed)
    for k in keys:
        for p, old in zip(params, before[k]):
            assert opt.state[p][k] is old
        base = before[k][0].base
        assert all(a.base is base for a in before[k])
    # a fresh optimizer over the same flat parameters loads the checkpoint
    cls, kwargs = CONFIGS[name]
    fresh = cls(params, **kwargs)
    fresh.load_state_dict(perturbed)
    calls = counting(fresh)
    rng = np.random.default_rng(5)
    for _ in range(2):
        for r, p, view in zip(ref_params, params, views):
            g = rng.standard_normal(r.array.shape).astype(r.array.dtype)
            r.grad = sn.Tensor(g)
            view[...] = g
            p.grad = sn.Tensor(view)
        del calls[:]
        ref_opt.step()
        fresh.step()
        assert calls == [sum(p.array.size for p in params)]
        assert_same(ref_opt, fresh, ref_params, params)


def test_storage_replaced_under_the_optimizer_falls_back_per_parameter():
    ref_opt, opt, ref_params, params, views, buffer = train("adam", np.float32, steps=2,
                                                            skip_at=9)
    calls = counting(opt)
    rng = np.random.default_rng(3)
    buffer.close()  # releases the claim: ``p.data = t`` is allowed again
    for step in range(3):
        if step == 1:  # a parameter moves out of the flat array, as PyTorch allows
            for p in params[2:4]:
                p.data = sn.tensor(np.array(p.array))
        for i, (r, p, view) in enumerate(zip(ref_params, params, views)):
            g = rng.standard_normal(r.array.shape).astype(np.float32)
            r.grad = sn.Tensor(g)
            view[...] = g
            # step 2: one gradient is its own array, not a view
            p.grad = sn.Tensor(g.copy() if step == 2 and i == 0 else view)
        del calls[:]
        ref_opt.step()
        opt.step()
        assert_same(ref_opt, opt, ref_params, params)
        # 6 parameters: one run; then [0, 2), 2, 3, [4, 6); then 0 alone too
        assert len(calls) == {0: 1, 1: 4, 2: 5}[step], (step, calls)
        assert sum(calls) == sum(p.array.size for p in params)


def test_a_deep_copy_of_the_optimizer_steps_its_own_copies():
    ref_opt, opt, ref_params, params, views, _ = train("sgd-momentum-dampening", np.float64,
                                                       steps=2, skip_at=9)
    twin = copy.deepcopy({"opt": opt})["opt"]
    twin_params = twin.param_groups[0]["params"]
    assert all(not np.shares_memory(a.array, b.array) for a, b in zip(twin_params, params))
    for p in twin_params:
        p.grad = sn.Tensor(np.ones_like(p.array))
    before = [np.array(p.array) for p in params]
    twin.step()
    for p, b in zip(params, before):  # the original is untouched
        np.testing.assert_array_equal(p.array, b)
    for p in ref_params:
        p.grad = sn.Tensor(np.ones_like(p.array))
    ref_opt.step()
    for r, t in zip(ref_params, twin_params):
        np.testing.assert_array_equal(t.array, r.array, strict=True)
