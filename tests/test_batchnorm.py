"""BatchNorm1d/2d and F.batch_norm against NumPy closed forms (PyTorch's
semantics: normalise by the biased batch variance, move the running variance
towards the unbiased one) and float64 finite differences."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import nn
from spmdnet.autograd import gradcheck

SHAPES = [(nn.BatchNorm1d, (5, 3)), (nn.BatchNorm1d, (4, 3, 5)), (nn.BatchNorm2d, (3, 3, 2, 4))]


def closed_form(x, eps=1e-5):
    """(normalised x, batch mean, biased var, unbiased var) per channel, NumPy."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    n = x.size // x.shape[1]
    xhat = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    return xhat, mean, var, var * n / (n - 1)


def channel(a, ndim):
    return a.reshape((1, -1) + (1,) * (ndim - 2))


@pytest.mark.parametrize("cls,shape", SHAPES)
def test_training_and_running_statistics_follow_the_closed_form(cls, shape):
    rng = np.random.default_rng(0)
    bn = cls(3, momentum=0.2, dtype=np.float64)
    bn.weight.data[...] = rng.standard_normal(3)
    bn.bias.data[...] = rng.standard_normal(3)
    rm, rv = np.zeros(3), np.ones(3)
    for _ in range(3):
        x = rng.standard_normal(shape) * 2.0 + 1.0
        out = bn(sn.tensor(x)).numpy()
        xhat, mean, _, unbiased = closed_form(x)
        want = xhat * channel(bn.weight.array, x.ndim) + channel(bn.bias.array, x.ndim)
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
        rm, rv = 0.8 * rm + 0.2 * mean, 0.8 * rv + 0.2 * unbiased
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-12)
    np.testing.assert_allclose(bn.running_var.numpy(), rv, rtol=1e-12)
    assert int(bn.num_batches_tracked.numpy()) == 3
    assert bn.num_batches_tracked.dtype == np.int64
    bn.eval()
    x = rng.standard_normal(shape)
    want = (x - channel(rm, x.ndim)) / np.sqrt(channel(rv, x.ndim) + 1e-5) \
        * channel(bn.weight.array, x.ndim) + channel(bn.bias.array, x.ndim)
    np.testing.assert_allclose(bn(sn.tensor(x)).numpy(), want, rtol=1e-12, atol=1e-12)
    assert int(bn.num_batches_tracked.numpy()) == 3  # eval counts nothing


def test_momentum_none_is_the_cumulative_average():
    rng = np.random.default_rng(1)
    bn = nn.BatchNorm2d(2, momentum=None, dtype=np.float64)
    batches = [rng.standard_normal((4, 2, 3, 3)) + i for i in range(4)]
    for x in batches:
        bn(sn.tensor(x))
    stats = [closed_form(x) for x in batches]
    np.testing.assert_allclose(bn.running_mean.numpy(), np.mean([s[1] for s in stats], 0))
    np.testing.assert_allclose(bn.running_var.numpy(), np.mean([s[3] for s in stats], 0))


def test_without_running_statistics_eval_uses_the_batch():
    bn = nn.BatchNorm1d(3, affine=False, track_running_stats=False, dtype=np.float64)
    assert list(bn.state_dict()) == [] and list(bn.parameters()) == []
    bn.eval()
    x = np.random.default_rng(2).standard_normal((6, 3))
    np.testing.assert_allclose(bn(sn.tensor(x)).numpy(), closed_form(x)[0], atol=1e-12)


def test_state_dict_keys_and_dtypes_are_pytorchs():
    bn = nn.BatchNorm2d(4)
    sd = bn.state_dict()
    assert list(sd) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    assert sd["running_var"].dtype == np.float32 and sd["num_batches_tracked"].shape == ()
    other = nn.BatchNorm2d(4)
    bn.running_mean.data[...] = 3.0
    other.load_state_dict(bn.state_dict())
    np.testing.assert_array_equal(other.running_mean.numpy(), 3.0)


def test_float32_stays_float32_and_gradients_flow():
    bn = nn.BatchNorm2d(3)
    x = sn.tensor(np.random.default_rng(3).standard_normal((2, 3, 4, 4)).astype(np.float32),
                  requires_grad=True)
    out = bn(x)
    (out * out).sum().backward()
    assert out.dtype == np.float32 and x.grad.dtype == np.float32
    assert bn.weight.grad.dtype == np.float32 and bn.running_var.dtype == np.float32


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(4, 3), (3, 2, 5), (2, 3, 2, 3)])
def test_batch_norm_gradients_match_finite_differences(training, affine, shape):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(shape)
    w, b = rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
    rm, rv = sn.tensor(rng.standard_normal(shape[1])), sn.tensor(rng.random(shape[1]) + 0.5)

    def fn(x, *affine):
        return F.batch_norm(x, None if training else rm, None if training else rv, *affine,
                            training=training)

    assert gradcheck(fn, x, w, b) if affine else gradcheck(fn, x)


def test_batch_norm_errors_name_the_shapes():
    x = sn.tensor(np.ones((1, 3)))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        F.batch_norm(x, None, None, training=True)
    with pytest.raises(ValueError, match=r"running_mean has shape \(2,\)"):
        F.batch_norm(sn.tensor(np.ones((4, 3))), sn.zeros(2), sn.ones(3))
    with pytest.raises(ValueError, match="expected 4D input, got 2D"):
        nn.BatchNorm2d(3)(sn.tensor(np.ones((4, 3))))
    with pytest.raises(ValueError, match="running_mean and running_var are required"):
        F.batch_norm(sn.tensor(np.ones((4, 3))), None, None, training=False)
