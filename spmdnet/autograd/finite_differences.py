"""Gradient checking against float64 central finite differences, so users
can check their own ``Function``s as the library's tests check its ops."""
import numpy as np

from .._tensor import Tensor
from .grad_mode import no_grad


def central_differences(loss, array, eps=1e-6):
    """d loss() / d array by central differences, perturbing ``array`` in
    place element by element (each element is restored after its pair of
    calls); ``loss`` takes no arguments and reads ``array`` itself."""
    grad = np.zeros_like(array)
    for i in np.ndindex(array.shape):
        old = array[i]
        array[i] = old + eps
        hi = loss()
        array[i] = old - eps
        lo = loss()
        array[i] = old
        grad[i] = (hi - lo) / (2 * eps)
    return grad


def numeric_grads(fn, arrays, weights, eps=1e-6):
    """d/dx sum(fn(*arrays) * weights) by central differences, per element."""
    def objective():
        with no_grad():
            out = fn(*[Tensor(a) for a in arrays])
        return float(np.sum(out.numpy() * weights))

    return [central_differences(objective, a, eps) for a in arrays]


def analytic_grads(fn, arrays, weights):
    tensors = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = fn(*tensors)
    out.backward(Tensor(weights))
    return [t.grad.array if t.grad is not None else np.zeros_like(t.array) for t in tensors]


def gradcheck(fn, *arrays, rtol=1e-5, atol=1e-7, seed=0):
    """Return True, or raise AssertionError when autograd and finite
    differences disagree.

    ``fn`` maps float64 Tensors to a Tensor; the check differentiates
    ``sum(fn(x) * w)`` for a random ``w``, which tests the full backward.
    """
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    rng = np.random.default_rng(seed)
    with no_grad():
        shape = fn(*[Tensor(a) for a in arrays]).shape
    weights = rng.standard_normal(shape)
    expected = numeric_grads(fn, arrays, weights)
    got = analytic_grads(fn, arrays, weights)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i} disagrees")
    return True
