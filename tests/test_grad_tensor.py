""".grad is a Tensor, as in PyTorch: backward makes it once and accumulates
into its .array in place; assigning an array or a Tensor works; the in-place
methods change .array where it lives; hooks receive and return Tensors;
clipping and optimizers read and write it. (DataParallel's bucket views:
tests/mpi/test_grad_tensor_mpi.py.)"""
import gc

import numpy as np
import pytest

import spmdnet as sn
from spmdnet import nn, optim
from spmdnet.autograd import grad_placement
from spmdnet.autograd.grad_placement import grad_home, has_placement, place_grad

X = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]])
B = np.array([10.0, -3.0, 0.25])

# name, call on the tensor, the same on a NumPy copy (plain NumPy oracle)
INPLACE = [
    ("+= scalar", lambda t: t.__iadd__(2.0), lambda a: a + 2.0),
    ("+= tensor", lambda t: t.__iadd__(sn.tensor(B)), lambda a: a + B),
    ("+= array", lambda t: t.__iadd__(B), lambda a: a + B),
    ("-= tensor", lambda t: t.__isub__(sn.tensor(B)), lambda a: a - B),
    ("*= scalar", lambda t: t.__imul__(0.5), lambda a: a * 0.5),
    ("*= tensor", lambda t: t.__imul__(sn.tensor(B)), lambda a: a * B),
    ("/= scalar", lambda t: t.__itruediv__(4.0), lambda a: a / 4.0),
    ("zero_", lambda t: t.zero_(), lambda a: np.zeros_like(a)),
    ("fill_", lambda t: t.fill_(7.0), lambda a: np.full_like(a, 7.0)),
    ("add_", lambda t: t.add_(sn.tensor(B)), lambda a: a + B),
    ("add_ alpha", lambda t: t.add_(sn.tensor(B), alpha=-0.5), lambda a: a - 0.5 * B),
    ("sub_ alpha", lambda t: t.sub_(B, alpha=2.0), lambda a: a - 2.0 * B),
    ("mul_", lambda t: t.mul_(sn.tensor(B)), lambda a: a * B),
    ("div_", lambda t: t.div_(2.0), lambda a: a / 2.0),
    ("copy_ tensor", lambda t: t.copy_(sn.tensor(X[::-1].copy())), lambda a: a[::-1]),
    ("copy_ broadcast", lambda t: t.copy_(B), lambda a: np.broadcast_to(B, a.shape)),
    ("copy_ float32", lambda t: t.copy_(X.astype(np.float32) * 3), lambda a: a * 3),
    ("setitem int", lambda t: t.__setitem__(0, 9.0), lambda a: np.vstack([np.full(3, 9.0), a[1:]])),
    ("setitem slice", lambda t: t.__setitem__((slice(None), 1), sn.tensor(np.array([5.0, 6.0]))),
     lambda a: np.column_stack([a[:, 0], [5.0, 6.0], a[:, 2]])),
    ("setitem mask", lambda t: t.__setitem__(sn.tensor(X) > 0, 0.0),
     lambda a: np.where(a > 0, 0, a)),
    ("setitem ellipsis", lambda t: t.__setitem__(Ellipsis, -1.0), lambda a: np.full_like(a, -1.0)),
]


@pytest.mark.parametrize("name,call,oracle", INPLACE, ids=[r[0] for r in INPLACE])
def test_inplace_method_changes_data_where_it_lives(name, call, oracle):
    buf = np.zeros(10)
    data = buf[2:8].reshape(2, 3)  # a view, like a gradient in a bucket
    data[...] = X
    t = sn.Tensor(data)
    out = call(t)
    assert out is None if name.startswith("setitem") else out is t
    assert t.array is data and np.shares_memory(t.array, buf)
    np.testing.assert_array_equal(buf[2:8].reshape(2, 3), oracle(X.copy()))
    assert buf[0] == buf[1] == buf[8] == buf[9] == 0.0


def test_augmented_assignment_keeps_the_object():
    t = sn.Tensor(X.copy())
    alias, data = t, t.array
    t += 1.0
    t *= 2.0
    assert t is alias and t.array is data
    np.testing.assert_array_equal(data, (X + 1.0) * 2.0)


def test_inplace_on_a_leaf_that_requires_grad_needs_no_grad():
    w = sn.tensor(X.copy(), requires_grad=True)
    for op in (lambda: w.__iadd__(1.0), lambda: w.mul_(2.0), lambda: w.zero_(),
               lambda: w.copy_(X), lambda: w.__setitem__(0, 1.0)):
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            op()
    np.testing.assert_array_equal(w.array, X)
    (w * 3.0).sum().backward()
    with sn.no_grad():  # the manual SGD step of PyTorch tutorials
        w -= 0.1 * w.grad
        w.grad.zero_()
    np.testing.assert_allclose(w.array, X - 0.3)
    assert w.requires_grad and w.is_leaf and not w.grad.array.any()


def test_augmented_assignment_inside_a_graph_stays_differentiable():
    x = sn.tensor(X.copy(), requires_grad=True)
    h = x * 2.0
    h += x  # out of place here: the graph records h = 2x + x
    h *= x
    h.sum().backward()
    np.testing.assert_allclose(x.grad.array, 6.0 * X)  # d/dx 3x^2
    with pytest.raises(RuntimeError, match="part of an autograd graph"):
        (x * 2.0).add_(1.0)
    acc = sn.zeros(2, 3, dtype=sn.float64)  # no grad, but the operand has one
    buf = acc.array
    acc += x
    assert acc.requires_grad and not buf.any()  # recorded out of place
    x.grad = None
    (acc * 2.0).sum().backward()
    np.testing.assert_allclose(x.grad.array, np.full((2, 3), 2.0))
    for op in (lambda t: t.add_(x), lambda t: t.copy_(x), lambda t: t.__setitem__(0, x[0])):
        with pytest.raises(RuntimeError, match="part of an autograd graph"):
            op(sn.zeros(2, 3, dtype=sn.float64))


def test_backward_makes_grad_a_tensor_and_accumulates_into_it():
    x = sn.tensor(X.copy(), requires_grad=True)
    (x * 2.0).sum().backward()
    g = x.grad
    assert type(g) is sn.Tensor and not g.requires_grad and isinstance(g.array, np.ndarray)
    data = g.array
    (x * x).sum().backward()
    assert x.grad is g and g.array is data  # accumulated in place
    np.testing.assert_allclose(g.array, 2.0 + 2.0 * X)
    assert float(x.grad.norm()) == pytest.approx(np.linalg.norm(2.0 + 2.0 * X))


# what is assigned to .grad -> whether the Tensor then shares the value's memory
ASSIGN = [("array", lambda a: a, True), ("tensor", lambda a: sn.Tensor(a), True),
          ("list", lambda a: a.tolist(), False)]


@pytest.mark.parametrize("name,make,shares", ASSIGN, ids=[r[0] for r in ASSIGN])
def test_assigning_grad(name, make, shares, float64):
    p = nn.Parameter(np.zeros((2, 3)))
    value = X.copy()
    p.grad = make(value)
    assert isinstance(p.grad, sn.Tensor)
    np.testing.assert_array_equal(p.grad.array, X)
    assert np.shares_memory(p.grad.array, value) == shares
    (p * 1.0).sum().backward()  # accumulates into the assigned gradient
    np.testing.assert_array_equal(p.grad.array, X + 1.0)
    p.grad = None
    assert p.grad is None


def test_assigning_a_grad_of_another_shape_or_dtype_raises():
    p = nn.Parameter(np.zeros((2, 3), np.float32))
    with pytest.raises(RuntimeError, match="different size"):
        p.grad = np.zeros((3, 2), np.float32)
    with pytest.raises(RuntimeError, match="different type"):
        p.grad = np.zeros((2, 3), np.float64)


def test_hooks_receive_and_return_tensors():
    x = sn.tensor(np.array([1.0, 2.0]), requires_grad=True)
    seen = []

    def double(g):
        seen.append(g)
        return g * 2.0  # a Tensor replaces the gradient

    x.register_hook(double)
    x.register_hook(lambda g: seen.append(g) or g.array + 1.0)  # an array works too
    (x * 3.0).sum().backward()
    assert all(type(g) is sn.Tensor for g in seen)
    np.testing.assert_array_equal(seen[0].array, [3.0, 3.0])
    np.testing.assert_array_equal(x.grad.array, [7.0, 7.0])
    posted = []
    x.register_post_accumulate_grad_hook(posted.append)
    (x * 1.0).sum().backward()
    assert posted == [x] and isinstance(posted[0].grad, sn.Tensor)


@pytest.mark.parametrize("clip", [
    lambda ps: nn.utils.clip_grad_norm_(ps, 0.5),
    lambda ps: optim.clip_grad_norm_(ps, 0.5, norm_type=float("inf")),
    lambda ps: nn.utils.clip_grad_value_(ps, 0.5)], ids=["norm", "inf-norm", "value"])
def test_clipping_changes_grad_in_place(clip):
    sn.manual_seed(0)
    model = nn.Linear(3, 2)
    model(sn.tensor(X.astype(np.float32) * 10)).sum().backward()
    grads = [p.grad for p in model.parameters()]
    arrays = [g.array for g in grads]
    before = [a.copy() for a in arrays]
    clip(list(model.parameters()))
    for p, g, a, b in zip(model.parameters(), grads, arrays, before):
        assert p.grad is g and g.array is a
        assert not np.array_equal(a, b) and np.abs(a).max() <= 0.5 + 1e-6


@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9), lambda ps: optim.Adam(ps, lr=0.1),
    lambda ps: optim.AdamW(ps, lr=0.1)], ids=["sgd", "adam", "adamw"])
def test_optimizers_step_on_and_zero_tensor_grads(make):
    sn.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = make(model.parameters())
    model(sn.tensor(X.astype(np.float32))).sum().backward()
    before = [p.numpy() for p in model.parameters()]
    grads = [p.grad for p in model.parameters()]
    opt.step()
    assert all(not np.array_equal(p.array, b) for p, b in zip(model.parameters(), before))
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is g and not g.array.any() for p, g in zip(model.parameters(), grads))
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_grad_placement_is_the_grad_tensor_backward_fills():
    p = nn.Parameter(np.zeros(3, np.float32))
    buf = np.zeros(5, np.float32)
    home = sn.Tensor(buf[1:4])
    place_grad(p, home)
    for step in range(3):
        p.grad = None
        (p * float(step + 1)).sum().backward()
        assert p.grad is home and np.shares_memory(p.grad.array, buf)
        np.testing.assert_array_equal(buf, [0, step + 1, step + 1, step + 1, 0])
    place_grad(p, None)  # removed: the next gradient is a new array
    p.grad = None
    (p * 7.0).sum().backward()
    assert p.grad is not home and not np.shares_memory(p.grad.array, buf)
    np.testing.assert_array_equal(p.grad.array, [7, 7, 7])


def test_a_callable_grad_placement_is_asked_when_the_gradient_arrives():
    p, q = nn.Parameter(np.zeros(2)), nn.Parameter(np.zeros(2))
    made = []

    def home(leaf):  # storage made on demand, once per backward
        if not made:
            made.append(sn.Tensor(np.zeros(2)))
        return made[0]
    place_grad(p, home)
    (p * 2.0 + q).sum().backward()
    assert len(made) == 1 and p.grad is made[0] and q.grad is not made[0]
    np.testing.assert_array_equal(p.grad.array, [2, 2])
    assert grad_home(q) is None and not has_placement(q) and has_placement(p)
    with pytest.raises(ValueError, match="shape"):
        place_grad(q, sn.Tensor(np.zeros(3)))
    with pytest.raises(RuntimeError, match="leaf"):
        place_grad(p * 2.0, sn.Tensor(np.zeros(2)))


def test_a_grad_placement_ends_with_its_leaf():
    p = nn.Parameter(np.zeros(2))
    place_grad(p, sn.Tensor(np.zeros(2)))
    key = id(p)
    del p
    gc.collect()
    assert key not in grad_placement._homes  # the registry holds no dead leaf


def test_tensor_holds_no_wrapper_state():
    # what wrappers need of a tensor (gradient placement, storage owner) lives outside it
    assert set(sn.Tensor.__slots__) == {"array", "_grad", "_requires_grad", "_ctx", "_hooks",
                                        "_post_hooks", "_retain", "__weakref__"}
