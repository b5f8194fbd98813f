"""The Python protocol of Tensor, as PyTorch's (issue 23 item 3): ``__index__``,
``__format__``, ``repr``; ``pow`` with tensor or number base and exponent
(gradients against float64 finite differences, PyTorch's values at the
edges); ``multinomial`` (PyTorch's errors, frequencies against the
probabilities, sequential sampling without replacement against its closed
form); ``inference_mode`` as a context and a decorator."""
import math

import numpy as np
import pytest

import spmdnet as sn
from tests.helpers.oracles import numeric_gradient

RNG = np.random.default_rng(3)


# -- __index__ and __format__ ------------------------------------------------------------------
def test_index_takes_single_element_integer_tensors():
    items = [0, 1, 2, 3]
    assert items[sn.tensor([3])] == 3 and items[sn.tensor(1)] == 1
    assert items[sn.tensor(True)] == 1  # bool is an integer type, as PyTorch
    assert items[sn.tensor(1):sn.tensor([3])] == [1, 2]  # slice bounds: data[i:i + block]
    assert list(range(sn.tensor(3))) == [0, 1, 2]
    assert hex(sn.tensor(255, dtype=sn.int32)) == "0xff"
    for bad in (sn.tensor(1.0), sn.tensor([1, 2])):
        with pytest.raises(TypeError, match="only integer tensors of a single element"):
            items[bad]


def test_format_zero_dim_as_its_scalar_others_as_pytorch():
    assert f"{sn.tensor(0.123456):.4f}" == "0.1235"
    assert f"{sn.tensor(3):d}" == "3" and f"{sn.tensor(7):>3}" == "  7"
    assert f"{sn.tensor([0.5])}" == "tensor([0.5000])"  # empty spec: str()
    with pytest.raises(TypeError, match="unsupported format string"):
        f"{sn.tensor([0.123456]):.4f}"  # PyTorch formats only 0-dim tensors


# -- repr: PyTorch's text, recorded from PyTorch 2 -----------------------------------------------
REPRS = [
    (lambda: sn.tensor([0, 1]), "tensor([0, 1])"),
    (lambda: sn.tensor([0.5, 1.0]), "tensor([0.5000, 1.0000])"),
    (lambda: sn.tensor([1.0, 2.0]), "tensor([1., 2.])"),
    (lambda: sn.tensor([1.0, 2.0], dtype=sn.float64), "tensor([1., 2.], dtype=torch.float64)"),
    (lambda: sn.tensor([1e-5, 2.0]), "tensor([1.0000e-05, 2.0000e+00])"),
    (lambda: sn.tensor([1.5e3, 2.0]), "tensor([1500.,    2.])"),
    (lambda: sn.tensor(3.25), "tensor(3.2500)"),
    (lambda: sn.tensor([1, 2], dtype=sn.int32), "tensor([1, 2], dtype=torch.int32)"),
    (lambda: sn.tensor([True, False]), "tensor([ True, False])"),
    (lambda: sn.tensor([math.nan, math.inf, -1.5]), "tensor([    nan,     inf, -1.5000])"),
    (lambda: sn.tensor([[1.0, 2.0], [3.0, -4.25]], requires_grad=True),
     "tensor([[ 1.0000,  2.0000],\n        [ 3.0000, -4.2500]], requires_grad=True)"),
    (lambda: sn.tensor([1.0, 2.0], requires_grad=True) * 2,
     "tensor([2., 4.], grad_fn=<MulBackward0>)"),
    (lambda: sn.zeros(0, 3), "tensor([], size=(0, 3))"),
    (lambda: sn.tensor([1 + 2j, 0.5 - 1j]), "tensor([1.0000+2.j, 0.5000-1.j])"),
    (lambda: sn.arange(2000.0), "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, "
                                "1.9980e+03,\n        1.9990e+03])"),
    (lambda: sn.arange(12.0).reshape(2, 3, 2),
     "tensor([[[ 0.,  1.],\n         [ 2.,  3.],\n         [ 4.,  5.]],\n\n"
     "        [[ 6.,  7.],\n         [ 8.,  9.],\n         [10., 11.]]])"),
    (lambda: sn.arange(3000).reshape(30, 100),
     "tensor([[   0,    1,    2,  ...,   97,   98,   99],\n"
     "        [ 100,  101,  102,  ...,  197,  198,  199],\n"
     "        [ 200,  201,  202,  ...,  297,  298,  299],\n        ...,\n"
     "        [2700, 2701, 2702,  ..., 2797, 2798, 2799],\n"
     "        [2800, 2801, 2802,  ..., 2897, 2898, 2899],\n"
     "        [2900, 2901, 2902,  ..., 2997, 2998, 2999]])"),
    (lambda: sn.arange(10.0) * 1.1,
     "tensor([0.0000, 1.1000, 2.2000, 3.3000, 4.4000, 5.5000, 6.6000, 7.7000, 8.8000,\n"
     "        9.9000])"),
]


@pytest.mark.parametrize("index", range(len(REPRS)))
def test_repr_is_pytorchs(index):
    make, want = REPRS[index]
    assert repr(make()) == want


def test_repr_of_a_sum_names_its_backward():
    x = sn.tensor([1.0, 2.0], requires_grad=True)
    assert repr((x * 2).sum()) == "tensor(6., grad_fn=<SumBackward0>)"


# -- pow ---------------------------------------------------------------------------------------
def test_pow_gradients_for_base_and_exponent(float64):
    a, b = RNG.random((2, 3)) + 0.5, RNG.standard_normal(3)
    w = RNG.standard_normal((2, 3))
    at, bt = sn.tensor(a, requires_grad=True), sn.tensor(b, requires_grad=True)
    (sn.pow(at, bt) * sn.tensor(w)).sum().backward()
    np.testing.assert_allclose(at.grad.numpy(),
                               numeric_gradient(lambda x: (x ** b * w).sum(), a), rtol=1e-7)
    np.testing.assert_allclose(bt.grad.numpy(),
                               numeric_gradient(lambda y: (a ** y * w).sum(), b), rtol=1e-7)


def test_pow_with_a_number_base_or_exponent(float64):
    x = RNG.standard_normal(4)
    t = sn.tensor(x, requires_grad=True)
    sn.pow(2.5, t).sum().backward()  # d 2.5^x/dx = 2.5^x ln 2.5
    np.testing.assert_allclose(t.grad.numpy(), 2.5 ** x * math.log(2.5), rtol=1e-13)
    t.grad = None
    sn.pow(t, 3).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), 3 * x ** 2, rtol=1e-13)
    np.testing.assert_array_equal(sn.pow(2, sn.tensor([1.0, 2.0])).numpy(), [2.0, 4.0])
    assert sn.pow(sn.tensor([2, 3]), 2).dtype == np.int64  # ints stay ints
    assert (sn.pow(sn.tensor([2.0, 3.0]), sn.tensor([2, 3]))).tolist() == [4.0, 27.0]
    with pytest.raises(TypeError, match="one of them must be a Tensor"):
        sn.pow(2, 3)


def test_pow_gradients_at_the_edges_are_pytorchs(float64):
    # values from PyTorch: 0**0 gives zero gradients; a negative base, a NaN exponent gradient
    a = sn.tensor([0.0, -1.0, 2.0], requires_grad=True)
    b = sn.tensor([0.0, 2.0, 0.5], requires_grad=True)
    (a ** b).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [0.0, -2.0, 0.5 * 2 ** -0.5], rtol=1e-15)
    assert b.grad[0].item() == 0.0 and math.isnan(b.grad[1].item())
    assert b.grad[2].item() == pytest.approx(2 ** 0.5 * math.log(2), rel=1e-15)
    a = sn.tensor([0.0], requires_grad=True)
    b = sn.tensor([-1.0], requires_grad=True)
    (a ** b).sum().backward()
    assert a.grad.item() == -math.inf and b.grad.item() == -math.inf


# -- multinomial -------------------------------------------------------------------------------
@pytest.mark.parametrize("args,match", [
    (([0.0, 1.0], 3), r"cannot sample n_sample > prob_dist.size\(-1\) samples without replacement"),
    (([-1.0, 1.0], 1), "probability tensor contains either `inf`, `nan` or element < 0"),
    (([1.0, math.nan], 1), "probability tensor contains either `inf`, `nan` or element < 0"),
    (([0.0, 0.0], 1), r"invalid multinomial distribution \(sum of probabilities <= 0"),
    (([[[1.0, 1.0]]], 1), "prob_dist must be 1 or 2 dim"),
    (([1.0, 2.0], 0), "cannot sample n_sample <= 0 samples"),
])
def test_multinomial_errors_are_pytorchs(args, match):
    probs, n = args
    with pytest.raises(RuntimeError, match=match):
        sn.multinomial(sn.tensor(probs), n)
    with pytest.raises(RuntimeError, match="only supports floating-point dtypes"):
        sn.multinomial(sn.tensor([1, 2]), 1)


def test_multinomial_with_replacement_follows_the_weights():
    sn.manual_seed(0)
    weights = sn.tensor([[1.0, 0.0, 3.0], [0.0, 2.0, 2.0]])  # unnormalised, as PyTorch takes
    draws = sn.multinomial(weights, 40000, replacement=True)
    assert draws.shape == (2, 40000) and draws.dtype == np.int64
    counts = np.stack([np.bincount(r, minlength=3) for r in draws.numpy()]) / 40000
    want = np.array([[0.25, 0.0, 0.75], [0.0, 0.5, 0.5]])
    assert counts[0, 1] == 0 and counts[1, 0] == 0  # zero weight: never drawn
    np.testing.assert_allclose(counts, want, atol=0.01)  # ~4.6 standard errors


def test_multinomial_without_replacement_is_sequential_sampling():
    # P(first = i) = p_i; P(second = j | first = i) = p_j / (1 - p_i)
    sn.manual_seed(1)
    p = np.array([0.5, 0.3, 0.2])
    draws = sn.multinomial(sn.tensor(p).expand(30000, 3), 2).numpy()
    assert all(len(set(row)) == 2 for row in draws[:200])
    pairs = np.zeros((3, 3))
    np.add.at(pairs, (draws[:, 0], draws[:, 1]), 1)
    want = np.array([[p[i] * p[j] / (1 - p[i]) if i != j else 0 for j in range(3)]
                     for i in range(3)])
    np.testing.assert_allclose(pairs / 30000, want, atol=0.012)
    full = sn.multinomial(sn.tensor([1.0, 0.0, 0.0]), 3)
    assert full.tolist() == [0, 1, 2]  # zero weights last, in index order (PyTorch's)


def test_multinomial_generator_and_seed_reproduce():
    w = sn.tensor([0.2, 0.3, 0.5])
    a = sn.multinomial(w, 5, True, generator=sn.Generator().manual_seed(7))
    b = sn.multinomial(w, 5, True, generator=sn.Generator().manual_seed(7))
    assert a.tolist() == b.tolist()
    sn.manual_seed(5)
    c = w.multinomial(2)
    sn.manual_seed(5)
    assert c.tolist() == sn.multinomial(w, 2).tolist() and c.shape == (2,)


# -- inference_mode ----------------------------------------------------------------------------
def test_inference_mode_context_and_decorators():
    x = sn.tensor([1.0], requires_grad=True)
    with sn.inference_mode():
        assert not sn.is_grad_enabled() and sn.is_inference_mode_enabled()
        assert not (x * 2).requires_grad
        with sn.inference_mode(False):
            assert sn.is_grad_enabled() and not sn.is_inference_mode_enabled()
            assert (x * 2).requires_grad
        assert sn.is_inference_mode_enabled()
    assert sn.is_grad_enabled() and not sn.is_inference_mode_enabled()

    @sn.inference_mode()
    def called():
        return (x * 2).requires_grad, sn.is_inference_mode_enabled()

    @sn.inference_mode
    def bare():
        """docstring kept"""
        return (x * 2).requires_grad

    assert called() == (False, True) and bare() is False and bare.__doc__ == "docstring kept"
    assert sn.is_grad_enabled() and (x * 2).requires_grad
    with pytest.raises(TypeError, match="mode must be a bool"):
        sn.inference_mode("yes")
