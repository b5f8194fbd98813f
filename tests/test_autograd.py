"""The backward engine: deep graphs, accumulation, graph freeing, memory,
no_grad, hooks and callbacks, and the aliasing rules for .grad (a Tensor).

Oracles are hand-computed derivatives and plain NumPy expressions."""
import gc
import tracemalloc
import weakref

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn


@pytest.fixture
def f64():
    """float64 default dtype for this test; float32 restored afterwards."""
    sn.set_default_dtype(np.float64)
    yield
    sn.set_default_dtype(np.float32)


def leaf(values):
    return sn.tensor(np.asarray(values, dtype=np.float64), requires_grad=True)


class Scale(sn.Function):
    """out = a * b, recording which input gradients the engine asked for."""

    calls = []

    def forward(self, a, b):
        self.a, self.b = a, b
        return a * b

    def backward(self, g):
        Scale.calls.append(self.needs_input_grad)
        need_a, need_b = self.needs_input_grad
        return (g * self.b if need_a else None), (g * self.a if need_b else None)


class Twin(sn.Function):
    """a + b whose backward hands ONE fresh array to both inputs."""

    def forward(self, a, b):
        return a + b

    def backward(self, g):
        h = g * 1.0
        return h, h


class Saver(sn.Function):
    """Identity that saves an array for backward (to watch it being freed)."""

    def forward(self, a):
        self.saved = a.copy()
        return a.copy()

    def backward(self, g):
        return g * 1.0


# -- deep graphs, accumulation, fan-out ------------------------------------------------
def test_chain_of_10000_ops_backpropagates_without_recursion():
    x = leaf([0.5, -1.0, 2.0])
    y = x
    for _ in range(5000):  # 10,000 recorded ops
        y = y * 1.0001
        y = y + 0.001
    y.sum().backward()
    np.testing.assert_allclose(x.grad, np.full(3, 1.0001 ** 5000), rtol=1e-12)
    assert x.grad.shape == (3,)


def test_deep_graph_kept_with_retain_graph_can_be_deleted():
    x = leaf([1.0])
    y = x
    for _ in range(20000):
        y = y * 1.0
    y.sum().backward(retain_graph=True)
    assert x.grad[0] == 1.0
    del y  # a 20,000-deep chain of tensors and contexts: no RecursionError
    gc.collect()


def test_gradients_accumulate_across_backward_calls():
    x = leaf([1.0, 2.0, -3.0])
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 3.0, 3.0])
    first = x.grad
    (x * x).sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0 + 2.0, 3.0 + 4.0, 3.0 - 6.0])
    assert x.grad is first  # accumulated in place


def test_fan_out_sums_the_three_uses():
    x = leaf([0.3, -0.7])
    y = x * 2.0 + x * x + x.exp()  # x used three times
    y.sum().backward()
    xv = np.array([0.3, -0.7])
    np.testing.assert_allclose(x.grad, 2.0 + 2.0 * xv + np.exp(xv), rtol=1e-14)


def test_same_tensor_twice_in_one_op():
    x = leaf([3.0])
    (x * x).backward(np.array([1.0]))
    assert x.grad[0] == 6.0
    y = leaf([2.0])
    (y + y).sum().backward()
    assert y.grad[0] == 2.0


def test_diamond_graph_matches_hand_derivative():
    x = leaf([0.4])
    h = x.tanh()
    z = h * h + h * 3.0  # h fans out, x reaches z through two paths
    z.sum().backward()
    t = np.tanh(0.4)
    np.testing.assert_allclose(x.grad, [(2 * t + 3.0) * (1 - t * t)], rtol=1e-14)


# -- graph freeing ---------------------------------------------------------------------
def test_split_pieces_add_into_one_gradient():
    """q, k, v of one projection (minGPT's split): the pieces' gradients are
    added into the input's in place; an unused piece contributes zeros, a
    piece used twice both uses, the input used directly too its own."""
    x = sn.tensor(np.arange(12.0).reshape(2, 6), requires_grad=True)
    q, k, v = x.split(2, dim=1)
    out = (q * 1.0 + k * 2.0).sum() + (q * 3.0).sum() + (x * x).sum()
    out.backward()
    want = np.tile([4.0, 4.0, 2.0, 2.0, 0.0, 0.0], (2, 1)) + 2 * np.arange(12.0).reshape(2, 6)
    np.testing.assert_array_equal(x.grad.numpy(), want)
    y = sn.tensor(np.ones((3, 4)), requires_grad=True)
    rows = y[[0, 0, 2]]  # integer-array pieces scatter-add into the same gradient
    (rows.sum() + y[1:].sum() * 2.0).backward()
    np.testing.assert_array_equal(y.grad.numpy(), [[2.0] * 4, [2.0] * 4, [3.0] * 4])


def test_summing_gradients_never_writes_into_a_users_array():
    """A hook's replacement gradient reaches two inputs of one op unchanged
    (a pass-through): summing them must make a new array, not add in place."""
    user = np.full(3, 5.0)
    x = sn.tensor(np.ones(3), requires_grad=True)
    p = x * 1.0
    q = p + p
    q.register_hook(lambda g: sn.Tensor(user))
    q.sum().backward()
    np.testing.assert_array_equal(user, [5.0] * 3)
    np.testing.assert_array_equal(x.grad.numpy(), [10.0] * 3)


class _TwoViews(sn.Function):
    """A custom op whose backward hands one fresh array to one input and a
    view of it (its transpose) to the other."""

    def forward(self, a, b):
        return 2 * a + 2 * b.T

    def backward(self, g):
        h = 2 * g
        return h, h.T


def test_in_place_sums_never_write_through_a_view_handed_to_another_input():
    x = sn.tensor(np.ones((2, 3)), requires_grad=True)
    y = sn.tensor(np.ones((3, 2)), requires_grad=True)
    xx, yy = x * 1.0, y * 1.0
    loss = _TwoViews.apply(xx, yy).sum() + (xx * 5.0).sum() + (yy * 3.0).sum()
    loss.backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 7.0))
    np.testing.assert_array_equal(y.grad.numpy(), np.full((3, 2), 5.0))


def test_a_leaf_gradient_a_hook_kept_is_not_the_grad_accumulated_into():
    x = sn.tensor(np.ones(3), requires_grad=True)
    kept = []
    x.register_hook(lambda g: kept.append(g))
    (x * 2.0).sum().backward()
    (x * 2.0).sum().backward()  # accumulates into x.grad in place
    np.testing.assert_array_equal(kept[0].numpy(), [2.0] * 3)
    np.testing.assert_array_equal(x.grad.numpy(), [4.0] * 3)


def test_graph_is_freed_after_backward():
    x = leaf([1.0, 2.0])
    y = (x * 2.0).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_array_equal(x.grad, [4.0, 8.0])  # 2 * 2x
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward()


def test_saved_arrays_are_released_by_backward():
    x = leaf(np.arange(4.0))
    y = Saver.apply(x)
    ref = weakref.ref(y._ctx.saved)
    y.sum().backward()
    gc.collect()
    assert ref() is None  # the array saved for backward is gone while y is alive
    np.testing.assert_array_equal(x.grad, np.ones(4))


def _mlp_step(model, x, y, lr):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    with sn.no_grad():
        for p in model.parameters():
            p.data -= lr * p.grad
    model.zero_grad()
    return loss


def test_memory_does_not_grow_over_1000_steps():
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    rng = np.random.default_rng(0)
    x = sn.tensor(rng.standard_normal((8, 4)).astype(np.float32))
    y = sn.tensor(rng.standard_normal((8, 2)).astype(np.float32))
    tracemalloc.start()
    try:
        for step in range(1, 1001):
            loss = _mlp_step(model, x, y, 0.01)
            if step == 100:
                gc.collect()
                at_100 = tracemalloc.get_traced_memory()[0]
        gc.collect()
        at_1000 = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert at_1000 - at_100 < 100_000, (at_100, at_1000)
    assert loss._ctx is None or getattr(loss._ctx, "freed", None)  # graph released


# -- no_grad, detach, requires_grad ----------------------------------------------------
def test_no_grad_records_no_graph_and_restores_mode():
    x = leaf([1.0, 2.0])
    with sn.no_grad():
        assert not sn.is_grad_enabled()
        y = x * 2.0 + 1.0
        with sn.enable_grad():
            z = x * 3.0
    assert sn.is_grad_enabled()
    assert y.requires_grad is False and y._ctx is None
    assert z.requires_grad is True and z._ctx is not None
    with pytest.raises(ValueError), sn.no_grad():
        raise ValueError("boom")
    assert sn.is_grad_enabled()  # restored after an exception too


def test_no_grad_as_decorator():
    @sn.no_grad()
    def double(t):
        """Docstring kept."""
        assert not sn.is_grad_enabled()
        return t * 2.0

    x = leaf([1.0])
    y = double(x)
    assert y.requires_grad is False and y._ctx is None
    assert double.__name__ == "double" and double.__doc__ == "Docstring kept."
    assert sn.is_grad_enabled()


def test_detach_shares_data_and_stops_gradient():
    x = leaf([2.0, 3.0])
    d = x.detach()
    assert d.requires_grad is False and d._ctx is None and d.is_leaf
    assert np.shares_memory(d.array, x.array)
    (d * x).sum().backward()
    np.testing.assert_array_equal(x.grad, [2.0, 3.0])  # only through the second factor


def test_gradients_only_where_needed():
    Scale.calls.clear()
    x = leaf([1.0, 2.0])
    c = sn.tensor(np.array([5.0, 7.0]))  # requires_grad False
    y = Scale.apply(x, c)
    assert y.requires_grad and y._ctx.needs_input_grad == (True, False)
    y.sum().backward()
    assert Scale.calls == [(True, False)]
    np.testing.assert_array_equal(x.grad, [5.0, 7.0])
    assert c.grad is None

    Scale.calls.clear()
    out = Scale.apply(sn.tensor(np.ones(2)), c)  # nobody needs a gradient
    assert out.requires_grad is False and out._ctx is None


def test_branch_without_grad_is_not_recorded():
    x = leaf([1.0])
    c = sn.tensor(np.array([2.0]))
    k = c.exp() * 3.0  # constant branch
    assert k._ctx is None and not k.requires_grad
    (x * k).sum().backward()
    np.testing.assert_allclose(x.grad, 3.0 * np.exp([2.0]))


def test_requires_grad_on_integer_array_raises():
    with pytest.raises(TypeError, match="int"):
        sn.tensor(np.arange(3), requires_grad=True)
    t = sn.tensor(np.arange(3))
    with pytest.raises(TypeError):
        t.requires_grad = True


# -- backward argument checks ---------------------------------------------------------
def test_backward_on_non_scalar_needs_grad():
    x = leaf([1.0, 2.0])
    y = x * 2.0
    with pytest.raises(RuntimeError, match=r"shape \(2,\)"):
        y.backward()


def test_backward_with_wrong_grad_shape_raises():
    x = leaf([1.0, 2.0])
    y = x * 2.0
    with pytest.raises(ValueError, match=r"\(3,\).*\(2,\)"):
        y.backward(np.ones(3))
    y.backward(np.array([1.0, 10.0]))  # right shape works
    np.testing.assert_array_equal(x.grad, [2.0, 20.0])


def test_backward_on_tensor_without_graph_raises():
    with pytest.raises(RuntimeError, match="requires_grad"):
        sn.tensor(np.array(1.0)).backward()


# -- aliasing --------------------------------------------------------------------------
def test_two_leaves_never_share_a_grad_array():
    a, b = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    (a + b).sum().backward()
    assert not np.shares_memory(a.grad, b.grad)
    a.grad += 100.0
    np.testing.assert_array_equal(b.grad, [1.0, 1.0])
    np.testing.assert_array_equal(a.grad, [101.0, 101.0])


def test_one_fresh_array_returned_for_two_inputs_is_copied():
    a, b = leaf([1.0]), leaf([2.0])
    Twin.apply(a, b).backward(np.array([5.0]))
    assert not np.shares_memory(a.grad, b.grad)
    a.grad *= 0.0
    assert b.grad[0] == 5.0


def test_grad_from_broadcast_view_is_writable_and_accumulates():
    a = leaf(np.zeros((2, 3)))
    a.sum().backward()  # Sum's backward is a read-only broadcast view
    assert a.grad.array.flags.writeable and a.grad.shape == (2, 3)
    a.grad += 1.0
    a.sum().backward()
    np.testing.assert_array_equal(a.grad, np.full((2, 3), 3.0))


def test_retained_grad_does_not_alias_leaf_grads():
    a, b = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    y = a + b
    y.retain_grad()
    y.sum().backward()
    a.grad[...] = -7.0
    np.testing.assert_array_equal(y.grad, [1.0, 1.0])
    np.testing.assert_array_equal(b.grad, [1.0, 1.0])


def test_retain_grad_on_non_leaf():
    x = leaf([1.0, -2.0])
    h = x * 2.0
    h.retain_grad()
    g = h * 5.0  # not retained
    (g * h).sum().backward()
    np.testing.assert_array_equal(h.grad, 10.0 * np.array([2.0, -4.0]))  # d(5h^2)/dh
    assert g.grad is None
    np.testing.assert_array_equal(x.grad, 20.0 * np.array([2.0, -4.0]))


# -- hooks -----------------------------------------------------------------------------
def test_register_hook_replaces_leaf_grad_and_can_be_removed():
    x = leaf([1.0, 2.0])
    seen = []

    def hook(g):
        seen.append(g.numpy())
        return g * 10.0

    handle = x.register_hook(hook)
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(seen[0], [3.0, 3.0])
    np.testing.assert_array_equal(x.grad, [30.0, 30.0])
    handle.remove()
    x.grad = None
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 3.0])
    assert len(seen) == 1


def test_register_hook_on_non_leaf_sees_total_grad_and_replaces_it():
    x = leaf([1.0])
    h = x * 2.0
    seen = []
    h.register_hook(lambda g: seen.append(g.numpy()))  # None: keep the gradient
    h.register_hook(lambda g: g * 0.5)
    (h * 3.0 + h * 4.0).sum().backward()  # h fans out: the hook runs once with 7
    assert len(seen) == 1 and seen[0][0] == 7.0
    assert x.grad[0] == 7.0 * 0.5 * 2.0


def test_hook_needs_requires_grad():
    with pytest.raises(RuntimeError):
        sn.tensor(np.ones(2)).register_hook(lambda g: g)


def _mlp(seed=0):
    sn.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4), nn.Tanh(),
                         nn.Linear(4, 2))


def test_post_accumulate_hook_fires_once_with_final_grad(f64):
    w = nn.Parameter(np.array([[0.5, -1.0], [2.0, 0.25]]))
    x = sn.tensor(np.array([1.0, 3.0]))
    events = []
    w.register_post_accumulate_grad_hook(lambda p: events.append(p.grad.numpy()))
    out = (w @ (w @ x)).sum()  # w used twice: one hook call once both uses arrived
    out.backward()
    assert len(events) == 1
    np.testing.assert_array_equal(events[0], w.grad)
    wv, xv = w.numpy(), np.array([1.0, 3.0])
    # d/dW sum(W W x) = 1 (W x)^T + W^T 1 x^T
    expected = np.outer(np.ones(2), wv @ xv) + np.outer(wv.T @ np.ones(2), xv)
    np.testing.assert_allclose(w.grad, expected, rtol=1e-14)
    (w @ x).sum().backward()  # second backward: fires again with the accumulated grad
    assert len(events) == 2
    np.testing.assert_allclose(events[1], expected + np.outer(np.ones(2), xv))


def test_post_accumulate_hooks_fire_in_order_of_readiness():
    model = _mlp()
    order, at_hook, unset = [], {}, {}
    handles = []
    for name, p in model.named_parameters():
        def hook(t, name=name):
            order.append(name)
            at_hook[name] = t.grad.numpy()
            unset[name] = {n for n, q in model.named_parameters() if q.grad is None}
        handles.append(p.register_post_accumulate_grad_hook(hook))
    x = sn.tensor(np.random.default_rng(1).standard_normal((6, 3)).astype(np.float32))
    model(x).sum().backward()
    names = [n for n, _ in model.named_parameters()]
    assert sorted(order) == sorted(names)  # each exactly once
    layer = {n: int(n.split(".")[0]) for n in names}
    pos = {n: i for i, n in enumerate(order)}
    for late, early in [(4, 2), (2, 0)]:  # later layers are ready first
        assert max(pos[n] for n in names if layer[n] == late) < min(
            pos[n] for n in names if layer[n] == early), order
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(at_hook[name], p.grad)
    # fired during backward, not after it: the first layer had no grad yet
    assert unset[order[0]] >= {"0.weight", "0.bias", "2.weight", "2.bias"}

    for h in handles:
        h.remove()
    order.clear()
    model(x).sum().backward()
    assert order == []


def test_queue_callback_runs_after_backward_finished():
    model = _mlp()
    params = list(model.parameters())
    state = {}

    def callback():
        state["grads"] = [None if p.grad is None else p.grad.numpy() for p in params]

    def first_ready_hook(p):
        sn.queue_callback(callback)
        state["queued_with_pending"] = sum(q.grad is None for q in params)

    params[-1].register_post_accumulate_grad_hook(first_ready_hook)
    x = sn.tensor(np.ones((2, 3), dtype=np.float32))
    model(x).sum().backward()
    assert state["queued_with_pending"] > 0  # queued while backward was running
    assert all(g is not None for g in state["grads"])  # ran once all grads were set
    for g, p in zip(state["grads"], params):
        np.testing.assert_array_equal(g, p.grad)


def test_queue_callback_outside_backward_raises():
    with pytest.raises(RuntimeError, match="backward"):
        sn.queue_callback(lambda: None)
    x = leaf([1.0])
    x.register_hook(lambda g: sn.queue_callback(lambda: None))
    (x * 2.0).sum().backward()
    with pytest.raises(RuntimeError):  # the queue is gone again after backward
        sn.queue_callback(lambda: None)
