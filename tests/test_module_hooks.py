"""nn.Module hooks against PyTorch's observed behaviour: the event lists below
were printed by PyTorch 2.13 for the same programs and written out by hand;
gradients seen by backward hooks are checked against closed forms."""
import warnings

import numpy as np
import pytest

import spmdnet as sn
from spmdnet import nn
from spmdnet.nn.modules import module as module_mod
from spmdnet.utils.hooks import RemovableHandle


@pytest.fixture
def f64():
    sn.set_default_dtype(np.float64)
    yield
    sn.set_default_dtype(np.float32)


def make_seq():
    sn.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.GELU(), nn.Dropout(0.0),
                         nn.Linear(4, 2), nn.Tanh())


def _child_events(name):
    return [("gpre", name), ("pre-prepend", name), ("pre", name), ("gfwd", name),
            ("fwd", name), ("fwd-kw", name, [])]


# PyTorch 2.13's order for the program of test_every_hook_fires_in_pytorchs_order
TORCH_EVENTS = [
    ("gpre", "seq"), ("pre-prepend", "seq"), ("pre", "seq"),
    *_child_events("0"), *_child_events("1"), *_child_events("2"), *_child_events("3"),
    *_child_events("4"), *_child_events("5"),
    ("gfwd", "seq"), ("fwd", "seq"), ("fwd-kw", "seq", []),
    ("bpre", "seq"),
    ("bpre", "5"), ("bwd", "5", 1, 1, [False]), ("bpre", "4"), ("bwd", "4", 1, 1, [False]),
    ("bpre", "3"), ("bwd", "3", 1, 1, [False]), ("bpre", "2"), ("bwd", "2", 1, 1, [False]),
    ("bpre", "1"), ("bwd", "1", 1, 1, [False]), ("bpre", "0"), ("bwd", "0", 1, 1, [False]),
    ("bwd", "seq", 1, 1, [False]),
]


def test_every_hook_fires_in_pytorchs_order_on_every_module_of_a_sequential():
    seq, ev, handles = make_seq(), [], []
    names = {m: n or "seq" for n, m in seq.named_modules()}
    handles.append(module_mod.register_module_forward_pre_hook(
        lambda m, a: ev.append(("gpre", names.get(m)))))
    handles.append(module_mod.register_module_forward_hook(
        lambda m, a, o: ev.append(("gfwd", names.get(m)))))
    try:
        for m in seq.modules():
            n = names[m]
            handles += [
                m.register_forward_pre_hook(lambda m, a, n=n: ev.append(("pre", n))),
                m.register_forward_hook(lambda m, a, o, n=n: ev.append(("fwd", n))),
                m.register_forward_pre_hook(lambda m, a, n=n: ev.append(("pre-prepend", n)),
                                            prepend=True),
                m.register_forward_hook(lambda m, a, k, o, n=n: ev.append(("fwd-kw", n,
                                                                           sorted(k))),
                                        with_kwargs=True),
                m.register_full_backward_pre_hook(lambda m, go, n=n: ev.append(("bpre", n))),
                m.register_full_backward_hook(lambda m, gi, go, n=n: ev.append(
                    ("bwd", n, len(gi), len(go), [g is None for g in gi]))),
            ]
        assert seq.fused_pairs() == []  # observed: every module's forward runs
        x = sn.randn(2, 3, requires_grad=True)
        seq(x).sum().backward()
        assert ev == TORCH_EVENTS
    finally:
        for h in handles:
            h.remove()
    assert seq.fused_pairs() == [(0, "relu"), (4, "tanh")]  # nothing observes them now
    ev.clear()
    seq(sn.randn(2, 3)).sum()
    assert ev == []


def test_hooks_on_a_fused_pair_see_what_the_unfused_modules_compute(f64):
    seq = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    assert seq.fused_pairs() == [(0, "relu")]
    x = sn.randn(5, 3)
    fused = seq(x).numpy()
    seen = []
    seq[1].register_forward_hook(lambda m, a, o: seen.append((a[0].numpy(), o.numpy())))
    assert seq.fused_pairs() == []
    np.testing.assert_array_equal(seq(x).numpy(), fused)
    (pre, out), = seen
    np.testing.assert_allclose(pre, x.numpy() @ seq[0].weight.numpy().T + seq[0].bias.numpy(),
                               rtol=1e-12)
    np.testing.assert_array_equal(out, np.maximum(pre, 0))


def test_backward_hooks_see_the_closed_form_gradients(f64):
    sn.manual_seed(1)
    seq = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    got = {}
    for name, m in seq.named_children():
        m.register_full_backward_pre_hook(lambda m, go, n=name: got.update(
            {f"pre{n}": go[0].numpy().copy()}))
        m.register_full_backward_hook(lambda m, gi, go, n=name: got.update(
            {f"in{n}": gi[0].numpy().copy(), f"out{n}": go[0].numpy().copy()}))
    rng = np.random.default_rng(0)
    xv, c = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    x = sn.tensor(xv, requires_grad=True)
    (seq(x) * sn.tensor(c)).sum().backward()
    w1, b1, w2 = (seq[0].weight.numpy(), seq[0].bias.numpy(), seq[2].weight.numpy())
    h = xv @ w1.T + b1
    g2 = c @ w2  # dL/d relu(h)
    g1 = g2 * (h > 0)  # dL/dh
    for key, want in [("out2", c), ("pre2", c), ("in2", g2), ("out1", g2), ("in1", g1),
                      ("out0", g1), ("in0", g1 @ w1)]:
        np.testing.assert_allclose(got[key], want, rtol=1e-12, atol=1e-14, err_msg=key)
    np.testing.assert_allclose(x.grad.numpy(), g1 @ w1, rtol=1e-12)


def test_hook_results_replace_inputs_outputs_and_gradients(f64):
    # PyTorch printed: [1.0, 3.0]; [3.0]; x.grad [[41, 61]], weight.grad [[10, 10], [10, 10]]
    r = nn.ReLU()
    r.register_forward_pre_hook(lambda m, args: args[0] * -1)  # a non-tuple is wrapped
    r.register_forward_hook(lambda m, args, out: out + 1)
    assert r(sn.tensor([1.0, -2.0])).tolist() == [1.0, 3.0]

    class Scaled(nn.Module):
        def forward(self, x, scale=1.0):
            return x * scale

    k = Scaled()
    k.register_forward_pre_hook(lambda m, args, kwargs: (args, {"scale": 3.0}),
                                with_kwargs=True)
    assert k(sn.tensor([1.0]), scale=2.0).tolist() == [3.0]
    k.register_forward_pre_hook(lambda m, args, kwargs: 5, with_kwargs=True)
    with pytest.raises(RuntimeError, match="forward pre-hook must return None or a tuple"):
        k(sn.tensor([1.0]))

    lin = nn.Linear(2, 2)
    lin.weight.data = sn.tensor([[1.0, 2.0], [3.0, 4.0]])
    lin.bias.data = sn.zeros(2)
    lin.register_full_backward_pre_hook(lambda m, go: (go[0] * 10,))
    lin.register_full_backward_hook(lambda m, gi, go: (gi[0] + 1,))
    x = sn.tensor([[1.0, 1.0]], requires_grad=True)
    lin(x).sum().backward()
    assert x.grad.tolist() == [[41.0, 61.0]]
    assert lin.weight.grad.tolist() == [[10.0, 10.0], [10.0, 10.0]]
    lin.register_full_backward_hook(lambda m, gi, go: (gi[0], gi[0]))
    with pytest.raises(RuntimeError, match="invalid number of grad_input, got 2, but "
                                           "expected 1"):
        lin(x).sum().backward()


def test_grad_input_has_one_entry_per_positional_argument(f64):
    # PyTorch printed: bpre [[1, 1], None]; bwd [[6, 8], [0, 0], None], [[1, 1], None]
    class Mul(nn.Module):
        def forward(self, a, b, k):
            return a * b * k, a.sum()

    m, ev = Mul(), []
    m.register_full_backward_pre_hook(lambda mod, go: ev.append(
        ("bpre", [None if g is None else g.tolist() for g in go])))
    m.register_full_backward_hook(lambda mod, gi, go: ev.append(
        ("bwd", [None if g is None else g.tolist() for g in gi],
         [None if g is None else g.tolist() for g in go])))
    a = sn.tensor([1.0, 2.0], requires_grad=True)
    out, _ = m(a, sn.tensor([3.0, 4.0]), 2.0)
    out.sum().backward()
    assert ev == [("bpre", [[1.0, 1.0], None]),
                  ("bwd", [[6.0, 8.0], [0.0, 0.0], None], [[1.0, 1.0], None])]
    assert a.grad.tolist() == [6.0, 8.0]


def test_a_module_whose_inputs_need_no_gradient_calls_its_backward_hook_at_the_output():
    lin, ev = nn.Linear(2, 1), []
    lin.register_full_backward_hook(lambda m, gi, go: ev.append((gi, go[0].shape)))
    with pytest.warns(UserWarning, match="no inputs require gradients"):
        lin(sn.ones((3, 2))).sum().backward()
    assert ev == [((None,), (3, 1))]


def test_always_call_hooks_run_when_forward_raises():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    m, calls = Boom(), []
    m.register_forward_hook(lambda mod, args, out: calls.append(("always", out)),
                            always_call=True)
    m.register_forward_hook(lambda mod, args, out: calls.append(("normal", out)))

    def broken(mod, args, out):
        raise KeyError("second")

    m.register_forward_hook(broken, always_call=True)
    with pytest.raises(ValueError, match="boom"), pytest.warns(UserWarning, match="second"):
        m(sn.ones(1))
    assert calls == [("always", None)]  # PyTorch's list for the same program


def test_handles_remove_hooks_and_work_as_context_managers():
    m, ev = nn.Identity(), []
    h1 = m.register_forward_hook(lambda mod, a, o: ev.append(1))
    assert isinstance(h1, RemovableHandle) and type(h1).__module__ == "spmdnet.utils.hooks"
    with m.register_forward_pre_hook(lambda mod, a: ev.append(0)):
        m(sn.ones(1))
    m(sn.ones(1))
    h1.remove()
    h1.remove()  # a second remove is a no-op, as PyTorch's
    m(sn.ones(1))
    assert ev == [0, 1, 1]
    assert not m._forward_hooks and not m._forward_pre_hooks
    g = module_mod.register_module_full_backward_hook(lambda mod, gi, go: ev.append("g"))
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert seq.fused_pairs() == []  # a global hook observes every module
    g.remove()
    assert seq.fused_pairs() == [(0, "relu")]


def test_a_subclass_or_an_assigned_forward_is_never_fused():
    class MyReLU(nn.ReLU):
        def forward(self, x):
            return super().forward(x) * 2

    assert nn.Sequential(nn.Linear(2, 2), MyReLU()).fused_pairs() == []
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    seq[1].forward = lambda x: x
    assert seq.fused_pairs() == []
    x = sn.randn(3, 2)
    np.testing.assert_array_equal(seq(x).numpy(), seq[0](x).numpy())


def test_state_dict_hooks_run_in_pytorchs_order():
    seq, ev = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2))), []
    names = {m: n or "root" for n, m in seq.named_modules()}
    for m in seq.modules():
        m.register_state_dict_pre_hook(lambda mod, prefix, kv: ev.append(
            ("sd_pre", names[mod], prefix, kv)))
        m.register_state_dict_post_hook(lambda mod, sd, prefix, md: ev.append(
            ("sd_post", names[mod], prefix, list(sd), md)))
        m.register_load_state_dict_pre_hook(
            lambda mod, sd, prefix, md, strict, mk, uk, em: ev.append(
                ("ld_pre", names[mod], prefix, sorted(sd), md, strict, list(mk), list(uk))))
        m.register_load_state_dict_post_hook(lambda mod, ik: ev.append(
            ("ld_post", names[mod], list(ik.missing_keys), list(ik.unexpected_keys))))
    seq.state_dict(prefix="p.")
    keys = ["p.0.weight", "p.0.bias", "p.1.0.weight", "p.1.0.bias"]
    v1 = {"version": 1}
    assert ev == [  # PyTorch 2.13's list
        ("sd_pre", "root", "p.", False), ("sd_pre", "0", "p.0.", False),
        ("sd_post", "0", "p.0.", keys[:2], v1), ("sd_pre", "1", "p.1.", False),
        ("sd_pre", "1.0", "p.1.0.", False), ("sd_post", "1.0", "p.1.0.", keys, v1),
        ("sd_post", "1", "p.1.", keys, v1), ("sd_post", "root", "p.", keys, v1)]
    sd = seq.state_dict()
    sd["extra"] = sn.zeros(1)
    del sd["0.bias"]
    ev.clear()
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "0.bias". \n\t'
                                           'Unexpected key\\(s\\) in state_dict: "extra". '):
        seq.load_state_dict(sd)
    assert [e for e in ev if e[0].startswith("ld")] == [  # PyTorch 2.13's list
        ("ld_pre", "root", "", ["0.weight", "1.0.bias", "1.0.weight", "extra"], v1, True,
         [], []),
        ("ld_pre", "0", "0.", ["0.weight"], v1, True, [], ["extra"]),
        ("ld_post", "0", ["0.bias"], ["extra"]),
        ("ld_pre", "1", "1.", ["1.0.bias", "1.0.weight"], v1, True, ["0.bias"], ["extra"]),
        ("ld_pre", "1.0", "1.0.", ["1.0.bias", "1.0.weight"], v1, True, ["0.bias"],
         ["extra"]),
        ("ld_post", "1.0", ["0.bias"], ["extra"]), ("ld_post", "1", ["0.bias"], ["extra"]),
        ("ld_post", "root", ["0.bias"], ["extra"])]
    result = seq.load_state_dict(sd, strict=False)
    assert (result.missing_keys, result.unexpected_keys) == (["0.bias"], ["extra"])


def test_load_hooks_can_rename_keys_and_forgive_missing_ones():
    old = nn.Linear(2, 3)
    new = nn.Linear(2, 3)
    sd = {"w": old.weight.detach().clone(), "b": old.bias.detach().clone()}

    def rename(mod, state, prefix, *rest):
        for short, full in (("w", "weight"), ("b", "bias")):
            if prefix + short in state:
                state[prefix + full] = state.pop(prefix + short)

    new.register_load_state_dict_pre_hook(rename)
    assert repr(new.load_state_dict(sd)) == "<All keys matched successfully>"
    np.testing.assert_array_equal(new.weight.numpy(), old.weight.numpy())
    assert set(sd) == {"w", "b"}  # the caller's dict is not edited
    fresh = nn.Linear(2, 3)
    fresh.register_load_state_dict_post_hook(lambda m, ik: ik.missing_keys.clear())
    fresh.load_state_dict({"weight": old.weight.detach()})  # strict, bias forgiven
    np.testing.assert_array_equal(fresh.weight.numpy(), old.weight.numpy())


def test_state_dict_post_hook_results():
    m = nn.Linear(2, 2)
    h = m.register_state_dict_post_hook(lambda *a: {})
    with pytest.raises(RuntimeError, match="state_dict post-hook must return None"):
        m.state_dict()
    h.remove()
    m._register_state_dict_hook(lambda mod, sd, prefix, md: {"only": 1})
    assert m.state_dict() == {"only": 1}  # the older form replaces the dict


def test_global_forward_hook_with_kwargs_and_no_warning_without_backward_hooks():
    seen = []
    h = module_mod.register_module_forward_hook(
        lambda m, a, k, o: seen.append((type(m).__name__, sorted(k))), with_kwargs=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            nn.Sequential(nn.Linear(2, 2), nn.ReLU())(sn.ones((1, 2)))
    finally:
        h.remove()
    assert seen == [("Linear", []), ("ReLU", []), ("Sequential", [])]
