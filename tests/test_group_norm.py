"""nn.GroupNorm, nn.InstanceNorm1d/2d and F.group_norm / F.instance_norm
against the documented equations in NumPy (each group or instance
normalised by its own mean and biased variance; running statistics moved
by the batch mean of the instances' unbiased variances), a hand-computed
case, and float64 finite differences."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn
from spmdnet.autograd import gradcheck

RNG = np.random.default_rng(0)


def np_group_norm(x, groups, weight=None, bias=None, eps=1e-5):
    n, c = x.shape[:2]
    rows = x.reshape(n, groups, -1)
    mean = rows.mean(-1, keepdims=True)
    var = rows.var(-1, keepdims=True)
    out = ((rows - mean) / np.sqrt(var + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(shape) + bias.reshape(shape)
    return out


@pytest.mark.parametrize("groups", [1, 2, 6])
@pytest.mark.parametrize("shape", [(3, 6), (2, 6, 5), (2, 6, 3, 4)])
def test_group_norm_matches_equation(float64, groups, shape):
    gn = nn.GroupNorm(groups, 6)
    gn.weight.array[...] = RNG.standard_normal(6)
    gn.bias.array[...] = RNG.standard_normal(6)
    x = RNG.standard_normal(shape)
    want = np_group_norm(x, groups, gn.weight.numpy(), gn.bias.numpy())
    np.testing.assert_allclose(gn(sn.tensor(x)).numpy(), want, rtol=1e-12, atol=1e-12)


def test_group_norm_hand_computed(float64):
    """Two groups of two channels of one value each: [1, 3 | 0, 4] -> [-1, 1 | -1, 1]."""
    out = F.group_norm(sn.tensor([[[1.0], [3.0], [0.0], [4.0]]]), 2, eps=0.0)
    np.testing.assert_allclose(out.numpy().ravel(), [-1, 1, -1, 1], rtol=1e-15)


@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_gradcheck(affine):
    x, w, b = RNG.standard_normal((2, 4, 3)), RNG.standard_normal(4), RNG.standard_normal(4)
    if affine:
        gradcheck(lambda x, w, b: F.group_norm(x, 2, w, b), x, w, b)
    else:
        gradcheck(lambda x: F.group_norm(x, 2), x)


def test_instance_norm_is_per_sample_per_channel(float64):
    norm = nn.InstanceNorm2d(3)
    x = RNG.standard_normal((2, 3, 4, 5))
    want = np_group_norm(x, 3)
    np.testing.assert_allclose(norm(sn.tensor(x)).numpy(), want, rtol=1e-12, atol=1e-12)
    assert norm.weight is None and norm.running_mean is None
    assert list(norm.state_dict()) == []
    unbatched = nn.InstanceNorm1d(3)(sn.tensor(x[0, :, 0]))
    np.testing.assert_allclose(unbatched.numpy(), np_group_norm(x[:1, :, 0], 3)[0],
                               rtol=1e-12, atol=1e-12)


def test_instance_norm_running_stats(float64):
    """Training: normalise by each instance's statistics and move the running
    ones by momentum toward the batch mean of (mean, unbiased var); eval:
    normalise by the running ones (PyTorch's rule, num_batches_tracked stays 0)."""
    norm = nn.InstanceNorm1d(3, momentum=0.25, affine=True, track_running_stats=True)
    x = RNG.standard_normal((4, 3, 6)) * 2 + 1
    out = norm(sn.tensor(x)).numpy()
    np.testing.assert_allclose(out, np_group_norm(x, 3), rtol=1e-12, atol=1e-12)
    mean = 0.25 * x.mean(-1).mean(0)
    var = 0.75 + 0.25 * x.var(-1, ddof=1).mean(0)
    np.testing.assert_allclose(norm.running_mean.numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(norm.running_var.numpy(), var, rtol=1e-12)
    assert int(norm.num_batches_tracked.item()) == 0
    assert list(norm.state_dict()) == ["weight", "bias", "running_mean", "running_var",
                                       "num_batches_tracked"]
    norm.eval()
    want = (x - mean[None, :, None]) / np.sqrt(var[None, :, None] + 1e-5)
    np.testing.assert_allclose(norm(sn.tensor(x)).numpy(), want, rtol=1e-12, atol=1e-12)


def test_instance_norm_gradcheck():
    x, w, b = RNG.standard_normal((2, 3, 4)), RNG.standard_normal(3), RNG.standard_normal(3)
    gradcheck(lambda x, w, b: F.instance_norm(x, weight=w, bias=b), x, w, b)


def test_errors_name_the_values():
    with pytest.raises(ValueError, match=r"num_channels \(6\) must be divisible by num_groups "
                                         r"\(4\)"):
        nn.GroupNorm(4, 6)
    with pytest.raises(RuntimeError, match=r"channels in input \(5\)"):
        F.group_norm(sn.randn(2, 5, 3), 2)
    with pytest.raises(ValueError, match="expected 2D or 3D input"):
        nn.InstanceNorm1d(3)(sn.randn(2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"match num_features \(3\), but got: 4"):
        nn.InstanceNorm2d(3, affine=True)(sn.randn(2, 4, 3, 3))
