"""``Tensor.data`` is PyTorch's: a detached Tensor sharing the tensor's
memory, so in-place methods on it write the original, and ``p.data = t``
rebinds the tensor to ``t``'s array. ``Tensor.array`` is the raw array.
The oracle is PyTorch's documented behaviour of ``.data`` and closed forms.
(Wrapper-owned parameters refusing ``p.data = t``: tests/mpi/test_tensor_data_mpi.py.)"""
import numpy as np
import pytest

import spmdnet as sn
from spmdnet import nn

pytestmark = pytest.mark.usefixtures("float64")

X = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -6.0]])


def param():
    return nn.Parameter(X.copy())


def test_data_is_a_new_detached_tensor_over_the_same_array():
    p = param()
    d = p.data
    assert type(d) is sn.Tensor and d is not p and d is not p.data
    assert d.array is p.array and np.shares_memory(d.array, p.array)
    assert not d.requires_grad and d.is_leaf and p.requires_grad
    y = p * 3.0  # a non-leaf: its .data is a leaf outside the graph too
    assert y.requires_grad and not y.is_leaf
    assert not y.data.requires_grad and y.data.is_leaf and y.data.array is y.array


def test_size_is_the_tensor_method_not_the_arrays_element_count():
    d = param().data
    assert d.size() == (2, 3) and d.size(1) == 3 and d.size(-2) == 2
    assert d.numel() == 6 and d.dim() == 2 and d.shape == (2, 3)


@pytest.mark.parametrize("write,want", [
    (lambda d: d.add_(sn.tensor(np.ones((2, 3))), alpha=-0.5), X - 0.5),
    (lambda d: d.sub_(2.0), X - 2.0),
    (lambda d: d.mul_(3.0), 3.0 * X),
    (lambda d: d.div_(2.0), X / 2.0),
    (lambda d: d.zero_(), np.zeros_like(X)),
    (lambda d: d.fill_(7.0), np.full_like(X, 7.0)),
    (lambda d: d.copy_(sn.tensor(X[::-1].copy())), X[::-1]),
    (lambda d: d.clamp_(-1.0, 2.0), np.clip(X, -1.0, 2.0)),
    (lambda d: d.clamp_(max=0.0), np.minimum(X, 0.0)),
    (lambda d: d.__setitem__(0, 5.0), np.vstack([np.full(3, 5.0), X[1]])),
    (lambda d: d.__setitem__((slice(None), 1), sn.tensor([8.0, 9.0])),
     np.column_stack([X[:, 0], [8.0, 9.0], X[:, 2]])),
], ids=["add_", "sub_", "mul_", "div_", "zero_", "fill_", "copy_", "clamp_", "clamp_max",
        "setitem_row", "setitem_tensor"])
def test_in_place_methods_on_data_write_the_parameter(write, want):
    p = param()
    array = p.array
    write(p.data)  # outside no_grad, as PyTorch allows through .data
    np.testing.assert_array_equal(p.numpy(), want)
    assert p.array is array  # written in place: views of the array (buckets) stay valid


def test_augmented_assignment_through_data_stays_in_place():
    p = param()
    array = p.array
    p.data *= 2.0  # p.data = p.data.__imul__(2.0): the setter sees the same array
    p.data -= sn.tensor(np.ones((2, 3)))
    np.testing.assert_array_equal(p.numpy(), 2.0 * X - 1.0)
    assert p.array is array and p.requires_grad


def test_random_fills_through_data_draw_the_same_values_as_a_fresh_tensor():
    p = param()
    sn.manual_seed(3)
    p.data.normal_(0.0, 0.02)
    sn.manual_seed(3)
    want = sn.zeros(2, 3).normal_(0.0, 0.02).numpy()
    assert not np.allclose(p.numpy(), X)
    np.testing.assert_array_equal(p.numpy(), want)
    sn.manual_seed(4)
    p.data.uniform_(-0.1, 0.1)
    sn.manual_seed(4)
    np.testing.assert_array_equal(p.numpy(), sn.zeros(2, 3).uniform_(-0.1, 0.1).numpy())
    assert np.abs(p.numpy()).max() <= 0.1


def test_a_graph_through_data_gives_the_parameter_no_gradient():
    p = param()
    assert not (p.data * p.data).sum().requires_grad  # nothing to backpropagate into p
    (p * p.data).sum().backward()  # d/dp sum(p * c) = c, the .data factor a constant
    np.testing.assert_array_equal(p.grad.numpy(), X)


def test_rebinding_data_takes_the_new_array_and_keeps_the_parameter():
    p = param()
    t = sn.tensor(np.arange(4.0))
    p.data = t  # another shape is allowed, as PyTorch
    assert isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf
    assert p.shape == (4,) and p.array is t.array
    t.add_(1.0)  # p now shares t's memory
    np.testing.assert_array_equal(p.numpy(), np.arange(4.0) + 1.0)
    (p * p).sum().backward()
    np.testing.assert_array_equal(p.grad.numpy(), 2.0 * (np.arange(4.0) + 1.0))


def test_rebinding_data_accepts_arrays_and_other_floating_dtypes():
    p = param()
    a = np.ones(2, np.float32)
    p.data = a  # an array is taken as it is (PyTorch wants a Tensor)
    assert p.array is a and p.dtype == np.float32 and p.requires_grad


def test_rebinding_data_keeps_the_old_gradient_as_pytorch():
    p = param()
    (p * 2.0).sum().backward()
    grad = p.grad
    p.data = sn.tensor(np.zeros(5))
    assert p.grad is grad and p.grad.shape == (2, 3)


@pytest.mark.parametrize("value,error,words", [
    (sn.tensor([1, 2]), RuntimeError, "must be floating point"),
    ([1.0, 2.0], TypeError, "has to be a tensor, but got list"),
])
def test_rebinding_data_refuses_what_pytorch_refuses(value, error, words):
    p = param()
    with pytest.raises(error, match=words):
        p.data = value
    np.testing.assert_array_equal(p.numpy(), X)


def test_integer_data_on_a_tensor_without_grad_is_allowed():
    t = sn.tensor(np.zeros(3))
    t.data = sn.tensor([1, 2, 3])
    assert t.dtype.kind == "i" and t.tolist() == [1, 2, 3]


def test_grad_data_zero_zeros_the_gradient_in_place():
    p = param()
    (p * p).sum().backward()
    grad, array = p.grad, p.grad.array
    np.testing.assert_array_equal(p.grad.data.numpy(), 2.0 * X)
    p.grad.data.zero_()
    assert p.grad is grad and p.grad.array is array and not array.any()


def test_max_over_data_returns_values_and_indices():
    outputs = nn.Linear(3, 4)(sn.tensor(np.random.default_rng(0).standard_normal((5, 3))))
    values, predicted = sn.max(outputs.data, 1)  # the CIFAR-10 tutorial's line
    logits = outputs.array
    np.testing.assert_array_equal(values.numpy(), logits.max(axis=1))
    np.testing.assert_array_equal(predicted.numpy(), logits.argmax(axis=1))
    assert not values.requires_grad
    labels = sn.tensor(logits.argmax(axis=1))
    assert (predicted == labels).sum().item() == 5


def test_hand_written_sgd_through_data_matches_the_closed_form():
    # loss = (w . x - y)^2, dloss/dw = 2 (w . x - y) x
    x, y, lr = np.array([1.0, 2.0, -1.0]), 0.5, 0.1
    w0 = np.array([0.3, -0.2, 0.4])
    w = nn.Parameter(w0.copy())
    want = w0.copy()
    for _ in range(3):
        w.grad = None
        loss = ((w * sn.tensor(x)).sum() - y) ** 2
        loss.backward()
        w.data.add_(w.grad, alpha=-lr)  # PyTorch's manual update, outside no_grad
        want = want - lr * 2.0 * (want @ x - y) * x
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-14)
    assert w.requires_grad and w.is_leaf
