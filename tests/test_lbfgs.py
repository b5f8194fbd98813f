"""optim.LBFGS against PyTorch 2.13's iterates (tests/fixtures/torch_files/
lbfgs.pt: Rosenbrock and a 5-D quadratic split over two parameters, with
and without the strong-Wolfe line search, a short history), and against
the closed-form minimum of the quadratic."""
from pathlib import Path

import numpy as np
import pytest

import spmdnet as sn

FIXTURE = Path(__file__).parent / "fixtures" / "torch_files" / "lbfgs.pt"
STARTS = {"rosenbrock": [[-1.5], [2.0]], "quadratic": [[[0.3, -0.2]], [1.0, 0.5, -1.0]]}
CASES = {  # as the fixture's generator ran them
    "rosen_plain": ("rosenbrock", dict(lr=1, max_iter=20), 5),
    "rosen_wolfe": ("rosenbrock", dict(lr=1, max_iter=20, line_search_fn="strong_wolfe"), 5),
    "rosen_wolfe_h3": ("rosenbrock", dict(lr=1, max_iter=7, history_size=3,
                                          line_search_fn="strong_wolfe"), 6),
    "quad_plain": ("quadratic", dict(lr=0.5, max_iter=4, history_size=2), 4),
    "quad_wolfe": ("quadratic", dict(max_iter=10, line_search_fn="strong_wolfe"), 2),
}


@pytest.fixture(scope="module")
def ref():
    return sn.load(FIXTURE)


def _problem(kind, ref):
    params = [sn.tensor(np.array(s, np.float64), requires_grad=True) for s in STARTS[kind]]
    if kind == "rosenbrock":
        def fn(x, y):
            return (1 - x) ** 2 + 100 * (y - x ** 2) ** 2
    else:
        a, b = ref["A"], ref["b"]

        def fn(u, v):
            z = sn.cat([u.reshape(-1), v.reshape(-1)])
            return 0.5 * (z @ (a @ z)) - b @ z
    return params, fn


def _run(opt, params, fn, steps):
    calls = [0]

    def closure():
        calls[0] += 1
        opt.zero_grad()
        loss = fn(*params).sum()
        loss.backward()
        return loss

    out = {"traj": [], "losses": [], "func_evals": [], "n_iter": [], "closure_calls": []}
    for _ in range(steps):
        out["losses"].append(float(opt.step(closure)))
        out["traj"].append(np.concatenate([p.detach().numpy().ravel() for p in params]))
        state = opt.state[params[0]]
        out["func_evals"].append(state["func_evals"])
        out["n_iter"].append(state["n_iter"])
        out["closure_calls"].append(calls[0])
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_iterates_and_evaluations_equal_pytorchs(ref, name):
    kind, kwargs, steps = CASES[name]
    params, fn = _problem(kind, ref)
    got = _run(sn.optim.LBFGS(params, **kwargs), params, fn, steps)
    want = ref[name]
    for key in ("func_evals", "n_iter", "closure_calls"):
        assert got[key] == want[key].numpy().tolist(), key
    # Rosenbrock's valley amplifies the last-bit differences of dot products
    # (BLAS against PyTorch's kernels) from 1e-16 to 1e-4 over ~40 iterations:
    # the first steps agree to 1e-8, the later ones to 1e-3; every evaluation
    # count, so every branch taken, agrees exactly
    close = 2 if name in ("rosen_plain", "rosen_wolfe_h3") else steps
    traj, want_traj = np.array(got["traj"]), want["traj"].numpy()
    np.testing.assert_allclose(traj[:close], want_traj[:close], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(traj, want_traj, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(got["losses"][:close], want["losses"].numpy()[:close],
                               rtol=1e-8, atol=1e-12)


def test_quadratic_converges_to_the_solution(ref):
    """A x = b: the strong-Wolfe search reaches it (to where the loss, flat
    to 1e-16 there, stops telling points apart) within a few steps."""
    params, fn = _problem("quadratic", ref)
    opt = sn.optim.LBFGS(params, line_search_fn="strong_wolfe", tolerance_grad=1e-12,
                         tolerance_change=1e-15)
    _run(opt, params, fn, 3)
    z = np.concatenate([p.detach().numpy().ravel() for p in params])
    np.testing.assert_allclose(z, np.linalg.solve(ref["A"].numpy(), ref["b"].numpy()),
                               rtol=1e-7, atol=1e-7)


def test_arguments_checked_as_pytorch():
    p = sn.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="line_search_fn"):
        sn.optim.LBFGS([p], line_search_fn="backtracking")
    with pytest.raises(ValueError, match="parameter groups"):
        sn.optim.LBFGS([{"params": [p]}, {"params": [sn.tensor([2.0], requires_grad=True)]}])
    with pytest.raises(RuntimeError, match="closure"):
        sn.optim.LBFGS([p]).step(None)
    assert sn.optim.LBFGS([p]).param_groups[0]["max_eval"] == 25  # max_iter * 5 // 4


def _flat_params(params):
    return np.concatenate([p.detach().numpy().ravel() for p in params])


@pytest.mark.parametrize("name", ["rosen_wolfe_h3", "quad_plain"])
def test_state_dict_resumes_exactly(ref, name, tmp_path):
    """k steps, a checkpoint through a file, a fresh LBFGS over fresh
    parameters loading it, m more steps: the iterates, losses and counts of
    k + m steps run uninterrupted, bit for bit (the short histories make
    the resumed run drop old curvature pairs too)."""
    kind, kwargs, steps = CASES[name]
    k, m = 2, steps - 2
    params, fn = _problem(kind, ref)
    whole = _run(sn.optim.LBFGS(params, **kwargs), params, fn, k + m)

    params, fn = _problem(kind, ref)
    opt = sn.optim.LBFGS(params, **kwargs)
    _run(opt, params, fn, k)
    sn.save({"opt": opt.state_dict(), "params": [p.detach() for p in params]},
            tmp_path / "ckpt.pt")
    saved = sn.load(tmp_path / "ckpt.pt")
    st = saved["opt"]["state"][0]
    size = sum(p.numel() for p in params)
    assert set(st) == {"func_evals", "n_iter", "d", "t", "old_dirs", "old_stps", "ro",
                       "H_diag", "prev_flat_grad", "prev_loss"}
    assert [tuple(v.shape) for v in st["old_dirs"]] == [(size,)] * len(st["ro"])

    params, fn = _problem(kind, ref)
    for p, w in zip(params, saved["params"]):
        p.data.copy_(w)
    fresh = sn.optim.LBFGS(params, **kwargs)
    fresh.load_state_dict(saved["opt"])
    rest = _run(fresh, params, fn, m)
    np.testing.assert_array_equal(np.array(rest["traj"]), np.array(whole["traj"][k:]))
    assert rest["losses"] == whole["losses"][k:]
    assert rest["func_evals"] == whole["func_evals"][k:]
    assert rest["n_iter"] == whole["n_iter"][k:]


def test_load_state_dict_takes_pytorchs_layout_and_checks_shapes(ref):
    """PyTorch saves ``ro`` and ``H_diag`` as 0-d tensors and also ``al``
    (a per-step buffer): they load as numbers, ``al`` is dropped; a flat
    vector of the wrong length is refused before anything changes."""
    params, fn = _problem("quadratic", ref)
    opt = sn.optim.LBFGS(params, max_iter=3)
    _run(opt, params, fn, 2)
    sd = opt.state_dict()
    st = sd["state"][0]
    torch_like = {**st, "ro": [np.array(r) for r in st["ro"]], "H_diag": np.array(st["H_diag"]),
                  "al": [np.array(0.5)] * len(st["ro"])}
    fresh = sn.optim.LBFGS(params, max_iter=3)
    fresh.load_state_dict({**sd, "state": {0: torch_like}})
    got = fresh.state[params[0]]
    assert "al" not in got and got["ro"] == st["ro"] and got["H_diag"] == st["H_diag"]
    assert all(isinstance(r, float) for r in got["ro"])

    bad = {**st, "old_dirs": [st["old_dirs"][0][:-1]]}
    fresh = sn.optim.LBFGS(params, max_iter=3)
    with pytest.raises(ValueError, match=r"'old_dirs' of parameter 0 has shape \(4,\)"):
        fresh.load_state_dict({**sd, "state": {0: bad}})
    assert fresh.state == {}
    with pytest.raises(ValueError, match="not a key of LBFGS's state"):
        fresh.load_state_dict({**sd, "state": {0: {**st, "momentum_buffer": st["d"]}}})


def test_other_optimizers_still_check_state_against_the_parameter():
    p = sn.tensor(np.ones((2, 3)), requires_grad=True)
    opt = sn.optim.SGD([p], lr=0.1, momentum=0.9)
    p.grad = sn.tensor(np.ones((2, 3)))
    opt.step()
    sd = opt.state_dict()
    sd["state"][0]["momentum_buffer"] = np.ones(6)
    with pytest.raises(ValueError, match=r"momentum_buffer' of parameter 0 has shape \(6,\)"):
        sn.optim.SGD([p], lr=0.1, momentum=0.9).load_state_dict(sd)


STATE_FIXTURE = FIXTURE.parent / "lbfgs_state.pt"


@pytest.mark.parametrize("name", ["quad_plain", "quad_wolfe"])
def test_loads_pytorchs_checkpoint_and_continues_as_pytorch(ref, name):
    """PyTorch's LBFGS checkpoint after two steps (its 0-d tensors and its
    ``al`` buffer included), loaded into a fresh LBFGS over the saved
    parameters: the next two steps are PyTorch's next two."""
    case = sn.load(STATE_FIXTURE)[name]
    params, fn = _problem("quadratic", ref)
    for p, w in zip(params, case["params"]):
        p.data.copy_(w)
    opt = sn.optim.LBFGS(params, **case["kwargs"])
    opt.load_state_dict(case["optimizer"])
    got = _run(opt, params, fn, 2)
    np.testing.assert_allclose(np.array(got["traj"]), case["traj"].numpy(), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(got["losses"], case["losses"].numpy(), rtol=1e-10, atol=1e-12)
    assert (got["func_evals"][-1], got["n_iter"][-1]) == (case["func_evals"], case["n_iter"])
