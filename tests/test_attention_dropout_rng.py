"""After the same ``manual_seed``, spmdnet's attention dropout on the CPU
drops what PyTorch's does: scaled_dot_product_attention, MultiheadAttention
(need_weights True and False) and TransformerEncoderLayer in train mode,
outputs and gradients to float rounding, and the generator left where
PyTorch leaves it (the next ``rand`` bitwise); three seeded
TransformerEncoder training steps give PyTorch's losses. PyTorch 2.13's
numbers: tests/fixtures/torch_rng/attention.npz (README.md there)."""
from pathlib import Path

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F

from . import attention_rng_cases as C

FIXTURE = Path(__file__).parent / "fixtures" / "torch_rng" / "attention.npz"


@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE) as f:
        return dict(f)


def _want(fixture, name, seed):
    prefix = f"{name}/{seed}/"
    return [fixture[f"{prefix}{i}"] for i in range(sum(k.startswith(prefix) for k in fixture))]


@pytest.mark.parametrize("seed", C.SEEDS)
@pytest.mark.parametrize("name", sorted(C.CASES))
def test_attention_dropout_equals_pytorchs(fixture, name, seed):
    got, want = C.CASES[name](sn, seed), _want(fixture, name, seed)
    assert len(got) == len(want), f"{name}: {len(got)} arrays, PyTorch's case has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, \
            f"{name}[{i}]: {g.shape} {g.dtype}, PyTorch's {w.shape} {w.dtype}"
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=C.TOL[g.dtype], atol=C.TOL[g.dtype],
                                       err_msg=f"{name}[{i}]")
        else:  # the draws after the call: the generator moved as PyTorch's
            np.testing.assert_array_equal(g, w, err_msg=f"{name}[{i}] (the next draws)")


def test_three_training_steps_give_pytorchs_losses(fixture):
    losses, after = C.encoder_training_losses(sn)
    np.testing.assert_allclose(losses, fixture["encoder_training/losses"], rtol=1e-5)
    np.testing.assert_array_equal(after, fixture["encoder_training/next"])


def test_the_mask_is_bernoulli_of_the_weights_shape():
    """Independently of the fixture: the dropped weights are
    ``bernoulli_(1 - p)`` over (..., L, S) from the generator, as F.dropout
    of the weights would draw them (row-major, one uniform each)."""
    rng = np.random.default_rng(3)
    q, k, v = (sn.tensor(rng.standard_normal(s)) for s in ((2, 5, 3), (2, 7, 3), (2, 7, 4)))
    sn.manual_seed(11)
    got = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    weights = F.softmax(q.matmul(k.transpose(-2, -1)) * (1 / np.sqrt(3)), dim=-1)
    sn.manual_seed(11)
    want = F.dropout(weights, 0.4).matmul(v)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-14)
    sn.manual_seed(11)
    F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    after = sn.rand(4).numpy()
    sn.manual_seed(11)
    sn.rand(2 * 5 * 7, dtype=sn.float64)  # one float64 uniform per weight
    np.testing.assert_array_equal(sn.rand(4).numpy(), after)


@pytest.mark.parametrize("qs, ks", [((2, 0, 4), (2, 5, 4)), ((2, 3, 4), (2, 0, 4)),
                                    ((0, 3, 4), (0, 5, 4))])
def test_empty_attention_draws_nothing(qs, ks):
    """PyTorch: no query rows, no keys or no batch give the empty (or, with
    no keys, zero) output and gradients, and draw nothing."""
    q, k = sn.zeros(*qs, requires_grad=True), sn.zeros(*ks, requires_grad=True)
    sn.manual_seed(2)
    out = F.scaled_dot_product_attention(q, k, k, dropout_p=0.3)
    after = sn.rand(3).numpy()
    out.sum().backward()
    assert tuple(out.shape) == qs and not np.any(out.numpy())
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    sn.manual_seed(2)
    np.testing.assert_array_equal(after, sn.rand(3).numpy())
