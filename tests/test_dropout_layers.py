"""nn.Dropout1d/2d/3d, AlphaDropout, FeatureAlphaDropout and their F.*
functions against PyTorch 2.13's outputs for the same seeds (printed by
PyTorch and written out here by hand), the gradient against the closed form
(the mask), and Module.to_empty / share_memory."""
import multiprocessing
import warnings

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import nn

# PyTorch: manual_seed(0), then the function on ones(shape), p=0.5
CHANNELS = [0, 0, 1, 0, 0, 0]  # the kept channels of a (2, 3, ...) input
CASES = [(F.dropout1d, (2, 3, 4)), (F.dropout2d, (2, 3, 2, 2)), (F.dropout3d, (2, 3, 1, 2, 2))]


@pytest.mark.parametrize("fn, shape", CASES)
def test_channel_dropout_draws_pytorchs_mask(fn, shape):
    sn.manual_seed(0)
    out = fn(sn.ones(shape), 0.5, True).numpy()
    want = np.repeat(np.array(CHANNELS, np.float32) * 2, int(np.prod(shape[2:])))
    np.testing.assert_array_equal(out.reshape(-1), want)


@pytest.mark.parametrize("fn, shape", [(F.dropout1d, (3, 4)), (F.dropout3d, (3, 1, 2, 2))])
def test_unbatched_input_is_one_sample(fn, shape):
    sn.manual_seed(0)
    out = fn(sn.ones(shape), 0.5, True).numpy().reshape(3, -1)
    np.testing.assert_array_equal(out, np.array([[0.0], [0.0], [2.0]]) * np.ones_like(out))


def test_dropout2d_takes_3d_input_as_batched_with_pytorchs_warning():
    sn.manual_seed(0)
    with pytest.warns(UserWarning, match="Received a 3D input to dropout2d"):
        out = F.dropout2d(sn.ones((3, 2, 2)), 0.5, True)
    assert out.numpy().reshape(-1).tolist() == [0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 0, 0]


def test_float64_mask_and_scale_are_pytorchs():
    sn.manual_seed(0)
    out = F.dropout2d(sn.ones((2, 5, 1, 1), dtype=sn.float64), 0.3).numpy().reshape(-1)
    k = 1 / 0.7
    np.testing.assert_array_equal(out, [0, 0, k, 0, k, 0, k, k, k, k])


def test_alpha_dropout_values_are_pytorchs():
    sn.manual_seed(0)
    out = F.alpha_dropout(sn.arange(6.0).reshape(2, 3), 0.5, True).numpy()
    low = -0.7791939377784729
    np.testing.assert_allclose(out, [[low, low, 2.5520036220550537], [low, low, low]],
                               rtol=1e-6)
    sn.manual_seed(0)
    out = F.feature_alpha_dropout(sn.arange(8.0).reshape(2, 2, 2), 0.5, True).numpy()
    np.testing.assert_allclose(out, [[[low, low], [low, low]],
                                     [[4.324813365936279, 5.211218357086182], [low, low]]],
                               rtol=1e-6)
    assert F.alpha_dropout(sn.arange(3.0), 1.0, True).tolist() == [0.0, 0.0, 0.0]
    assert F.alpha_dropout(sn.ones(2), 0.5, False).tolist() == [1.0, 1.0]


def test_alpha_dropout_keeps_mean_and_variance_of_a_standard_normal():
    sn.manual_seed(1)
    x = sn.tensor(np.random.default_rng(0).standard_normal(200_000))
    y = F.alpha_dropout(x, 0.2, True).numpy()
    assert abs(y.mean()) < 0.01 and abs(y.var() - 1) < 0.02


def test_errors_name_the_values_as_pytorch():
    with pytest.raises(RuntimeError, match="dropout1d: Expected 2D or 3D input, but received "
                                           "a 1D input"):
        F.dropout1d(sn.ones(4), 0.5)
    with pytest.warns(UserWarning, match="Received a 1-D input to dropout2d"), \
            pytest.raises(RuntimeError, match="Feature dropout requires at least 2 dimensions"):
        F.dropout2d(sn.ones(4), 0.5)
    with pytest.raises(ValueError, match="between 0 and 1, but got 1.5"):
        nn.AlphaDropout(1.5)


def test_modules_repr_eval_and_gradient():
    assert [repr(m) for m in (nn.Dropout2d(0.3), nn.AlphaDropout(0.2), nn.FeatureAlphaDropout(),
                              nn.Dropout1d(inplace=True))] == [
        "Dropout2d(p=0.3, inplace=False)", "AlphaDropout(p=0.2, inplace=False)",
        "FeatureAlphaDropout(p=0.5, inplace=False)", "Dropout1d(p=0.5, inplace=True)"]
    for cls, shape in ((nn.Dropout1d, (2, 3, 4)), (nn.Dropout2d, (2, 3, 4, 4)),
                       (nn.Dropout3d, (2, 3, 4, 4, 4)), (nn.AlphaDropout, (2, 3)),
                       (nn.FeatureAlphaDropout, (2, 3, 4))):
        assert cls.__module__ == "spmdnet.nn.modules.dropout"
        x = sn.randn(*shape)
        np.testing.assert_array_equal(cls(0.4).eval()(x).numpy(), x.numpy())
    x = sn.randn(4, 6, 5, requires_grad=True)
    m = nn.Dropout1d(0.5)
    y = m(x)
    y.sum().backward()
    mask = y.numpy() / x.numpy()  # 0 or 2 per channel
    np.testing.assert_allclose(x.grad.numpy(), mask, rtol=1e-6)
    assert set(np.unique(np.round(mask, 5))) <= {0.0, 2.0}
    assert (mask == mask[:, :, :1]).all()  # one draw per channel


def test_to_empty_keeps_the_parameters_and_reset_parameters_redraws_them():
    sn.manual_seed(3)
    ref = nn.Linear(3, 2)
    m = nn.Linear(3, 2)
    w = m.weight
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert m.to_empty(device="cpu") is m
    assert m.weight is w and m.weight.shape == (2, 3) and m.weight.dtype == ref.weight.dtype
    sn.manual_seed(3)
    m.reset_parameters()
    np.testing.assert_array_equal(m.weight.numpy(), ref.weight.numpy())


def _hogwild_step(model):
    opt = sn.optim.SGD(model.parameters(), lr=0.5)
    for p in model.parameters():
        p.grad = sn.ones(p.shape)
    opt.step()


def test_share_memory_lets_a_forked_process_update_the_parameters():
    m = nn.Linear(3, 2)
    before = [p.numpy().copy() for p in m.parameters()]
    assert m.share_memory() is m
    child = multiprocessing.get_context("fork").Process(target=_hogwild_step, args=(m,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    for p, b in zip(m.parameters(), before):
        np.testing.assert_allclose(p.numpy(), b - 0.5, rtol=1e-6)
