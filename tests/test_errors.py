"""Bad input raises ValueError/TypeError whose message shows the values."""
import operator
import re

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import backend, nn


def t(shape, requires_grad=False):
    return sn.tensor(np.ones(shape, dtype=np.float32), requires_grad=requires_grad)


def test_matmul_shape_mismatch_shows_both_shapes():
    with pytest.raises(ValueError) as err:
        t((2, 3)) @ t((4, 5))
    msg = str(err.value)
    assert "(2, 3)" in msg and "(4, 5)" in msg


def test_batched_matmul_shape_mismatch_shows_both_shapes():
    with pytest.raises(ValueError) as err:
        t((6, 2, 3)) @ t((6, 4, 5))
    assert "(6, 2, 3)" in str(err.value) and "(6, 4, 5)" in str(err.value)


@pytest.mark.parametrize("op", [operator.add, operator.sub, operator.mul, operator.truediv])
def test_non_broadcastable_elementwise_shows_both_shapes(op):
    with pytest.raises(ValueError) as err:
        op(t((2, 3), requires_grad=True), t((4,)))
    msg = str(err.value)
    assert "(2, 3)" in msg and "(4,)" in msg


def test_linear_wrong_in_features_shows_shapes():
    lin = nn.Linear(3, 2)
    with pytest.raises(ValueError) as err:
        lin(t((5, 4)))
    msg = str(err.value)
    assert "(5, 4)" in msg and "(2, 3)" in msg
    with pytest.raises(ValueError, match=re.escape("(2, 3)")):
        F.linear(t((5, 4)), lin.weight)


def test_cross_entropy_label_out_of_range_names_label():
    logits = t((3, 4), requires_grad=True)
    with pytest.raises(IndexError, match=r"target 7\b"):  # PyTorch's IndexError
        F.cross_entropy(logits, np.array([0, 7, 1]))
    with pytest.raises(IndexError, match=r"target -1\b"):
        F.cross_entropy(logits, np.array([0, -1, 1]))


def test_cross_entropy_bad_labels_shape_and_dtype():
    logits = t((3, 4))
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(2,\)"):
        F.cross_entropy(logits, np.array([0, 1]))
    with pytest.raises(TypeError, match="float"):
        F.cross_entropy(logits, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(logits, np.array([0, 1, 2]), reduction="avg")


def test_mse_loss_shape_mismatch_shows_shapes():
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 2\)"):
        F.mse_loss(t((2, 3)), t((3, 2)))


def test_embedding_index_out_of_range():
    emb = nn.Embedding(4, 2)
    with pytest.raises(IndexError, match="max 9"):  # PyTorch's IndexError
        emb(np.array([1, 9]))


def _fake_cupy_array():
    return type("ndarray", (), {"__module__": "cupy"})()


def test_mixing_numpy_and_cupy_raises_type_error_naming_both():
    fake = _fake_cupy_array()
    for args in [(np.ones(2), fake), (fake, np.ones(2)), (None, np.ones(1), 3.0, fake)]:
        with pytest.raises(TypeError) as err:
            backend.xp_of(*args)
        msg = str(err.value)
        assert "numpy.ndarray" in msg and "cupy.ndarray" in msg


def test_xp_of_numpy_only_and_scalars():
    assert backend.xp_of(np.ones(2), None, 1.5, np.float32(2.0)) is np
    assert backend.xp_of() is np


@pytest.mark.gpu
def test_cupy_tensor_op_matches_numpy():
    if not backend.cupy_available():
        pytest.skip("needs CuPy and a CUDA device")
    cp = backend.require_cupy()
    rng = np.random.default_rng(0)
    av, bv = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))
    a = sn.tensor(cp.asarray(av), requires_grad=True)
    b = sn.tensor(cp.asarray(bv), requires_grad=True)
    out = (a @ b).tanh()
    assert out.device == "gpu" and backend.is_cupy_array(out.array)
    np.testing.assert_allclose(out.numpy(), np.tanh(av @ bv), rtol=1e-10)
    out.sum().backward()
    dy = 1 - np.tanh(av @ bv) ** 2
    np.testing.assert_allclose(a.grad.numpy(), dy @ bv.T, rtol=1e-10)
    np.testing.assert_allclose(b.grad.numpy(), av.T @ dy, rtol=1e-10)
    with pytest.raises(TypeError):  # a GPU tensor never silently meets a host one
        a + sn.tensor(av)
