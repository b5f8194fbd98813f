"""spmdnet.nn.functional against PyTorch's semantics, without PyTorch.

One row per function (or argument combination): forward against a plain
NumPy expression, backward against float64 central differences
(``sn.autograd.gradcheck``). Where a NumPy expression could share a
misreading of PyTorch, values are pinned by hand from PyTorch's documented
formulas (cross_entropy's denominator, F.pad's pair order).
"""
import importlib
import math

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F_OLD
import spmdnet.nn.functional as F
from spmdnet.nn import functional as F_FROM
from spmdnet import backend, kernels
from spmdnet.autograd import gradcheck

RNG = np.random.default_rng(0)
DEVICE = {"now": "cpu"}  # where const() puts the cases' constants (the GPU test moves it)


def const(a):
    return sn.tensor(backend.to_device(np.asarray(a), DEVICE["now"]))


def randn(*shape):
    return RNG.standard_normal(shape)


def uniform(*shape, low=0.05, high=0.95):
    return RNG.uniform(low, high, shape)


def np_log_softmax(x, axis):
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def np_softmax(x, axis):
    return np.exp(np_log_softmax(x, axis))


def np_sigmoid(x):
    return 1 / (1 + np.exp(-x))


def np_cross_entropy(x, y, weight=None, ignore_index=-100, eps=0.0, reduction="mean"):
    """PyTorch's documented formula: the target is the mixture
    (1-ε)·onehot(y) + ε/C, l_n = -Σ_c w_c·q_c·log p_c, ignored targets 0;
    "mean" divides by Σ_n w_{y_n} over the targets not ignored."""
    c = x.shape[1]
    logp = np.moveaxis(np_log_softmax(x, 1), 1, -1).reshape(-1, c)
    flat = y.reshape(-1)
    w = np.ones(c) if weight is None else weight
    keep = flat != ignore_index
    yy = np.where(keep, flat, 0)
    q = (1 - eps) * np.eye(c)[yy] + eps / c
    losses = -(q * w * logp).sum(1) * keep
    if reduction == "none":
        return losses.reshape(y.shape)
    return losses.sum() / (w[yy] * keep).sum() if reduction == "mean" else losses.sum()


def np_cross_entropy_probs(x, t, weight=None, eps=0.0, reduction="mean"):
    c = x.shape[1]
    q = t * (1 - eps) + eps / c
    w = np.ones(c) if weight is None else weight
    shape = (1, c) + (1,) * (x.ndim - 2)
    losses = -(np_log_softmax(x, 1) * q * w.reshape(shape)).sum(1)
    return {"none": losses, "sum": losses.sum(), "mean": losses.mean()}[reduction]


def np_nll(x, y, weight, ignore_index):
    keep = y != ignore_index
    yy = np.where(keep, y, 0)
    picked = np.take_along_axis(x, yy[:, None], 1)[:, 0]
    return -(picked * weight[yy] * keep).sum() / (weight[yy] * keep).sum()


def np_sdpa(q, k, v, mask=None, causal=False, scale=None):
    s = q @ np.swapaxes(k, -2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), bool))
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    return np_softmax(s, -1) @ v


def np_layer_norm(x, k, w=None, b=None, eps=1e-5):
    axes = tuple(range(x.ndim - k, x.ndim))
    out = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    return out if w is None else out * w + b


NP_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
                "circular": "wrap"}


def np_pad(x, pad, mode):
    widths = [(0, 0)] * x.ndim
    for k in range(len(pad) // 2):
        widths[x.ndim - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    return np.pad(x, widths, mode=NP_PAD_MODES[mode])


Y4 = np.array([2, 0, 1, 2])
Y_IGNORED = np.array([2, -100, 1, 0])
Y_ND = np.array([[[0, 2, 1], [1, 1, 0]], [[2, 0, 0], [1, 2, 2]]])  # (N=2, d1=2, d2=3)
Y_ND_IGNORED = np.where(Y_ND == 1, 7, Y_ND)  # 7: ignore_index, outside [0, C)
W3 = np.array([0.5, 2.0, 1.25])
MASK = RNG.random((3, 4)) > 0.3
MASK[:, 0] = True  # every query attends somewhere
EMB_IDX = np.array([[0, 3, 3], [1, 0, 4]])

# (name, F call, NumPy reference, float64 inputs): forward and gradcheck
CASES = [
    # activations
    ("relu", F.relu, lambda x: np.maximum(x, 0), [randn(3, 5)]),
    ("tanh", F.tanh, np.tanh, [randn(3, 5)]),
    ("sigmoid", F.sigmoid, np_sigmoid, [randn(3, 5)]),
    ("silu", F.silu, lambda x: x * np_sigmoid(x), [randn(3, 5) * 3]),
    ("leaky_relu", F.leaky_relu, lambda x: np.where(x > 0, x, 0.01 * x), [randn(3, 5)]),
    ("leaky_relu_slope", lambda x: F.leaky_relu(x, negative_slope=0.2),
     lambda x: np.where(x > 0, x, 0.2 * x), [randn(3, 5)]),
    ("elu", F.elu, lambda x: np.where(x > 0, x, np.expm1(x)), [randn(3, 5)]),
    ("elu_alpha", lambda x: F.elu(x, alpha=1.5),
     lambda x: np.where(x > 0, x, 1.5 * np.expm1(x)), [randn(3, 5)]),
    ("softplus", F.softplus, lambda x: np.log1p(np.exp(x)), [randn(3, 5) * 3]),
    ("softplus_beta_threshold", lambda x: F.softplus(x, beta=2.0, threshold=3.0),
     lambda x: np.where(2 * x > 3, x, np.log1p(np.exp(2 * x)) / 2), [randn(3, 5) * 2]),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"),
     lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
     [randn(3, 5)]),
    ("linear", F.linear, lambda x, w, b: x @ w.T + b, [randn(4, 3), randn(5, 3), randn(5)]),
    # softmax family, dim (and the axis alias)
    ("softmax_dim1_3d", lambda x: F.softmax(x, dim=1), lambda x: np_softmax(x, 1),
     [randn(2, 3, 4)]),
    ("softmax_dim_neg", lambda x: F.softmax(x, -1), lambda x: np_softmax(x, -1), [randn(3, 5)]),
    ("softmax_axis_alias", lambda x: F.softmax(x, axis=0), lambda x: np_softmax(x, 0),
     [randn(3, 5)]),
    ("log_softmax_dim0", lambda x: F.log_softmax(x, dim=0), lambda x: np_log_softmax(x, 0),
     [randn(4, 3)]),
    # class-index losses
    ("cross_entropy", lambda x: F.cross_entropy(x, Y4), lambda x: np_cross_entropy(x, Y4),
     [randn(4, 3)]),
    ("cross_entropy_sum", lambda x: F.cross_entropy(x, Y4, reduction="sum"),
     lambda x: np_cross_entropy(x, Y4, reduction="sum"), [randn(4, 3)]),
    ("cross_entropy_none", lambda x: F.cross_entropy(x, Y4, reduction="none"),
     lambda x: np_cross_entropy(x, Y4, reduction="none"), [randn(4, 3)]),
    ("cross_entropy_nd", lambda x: F.cross_entropy(x, Y_ND),
     lambda x: np_cross_entropy(x, Y_ND), [randn(2, 3, 2, 3)]),
    ("cross_entropy_nd_none", lambda x: F.cross_entropy(x, Y_ND, reduction="none"),
     lambda x: np_cross_entropy(x, Y_ND, reduction="none"), [randn(2, 3, 2, 3)]),
    ("cross_entropy_weight", lambda x: F.cross_entropy(x, Y4, weight=const(W3)),
     lambda x: np_cross_entropy(x, Y4, W3), [randn(4, 3)]),
    ("cross_entropy_ignore", lambda x: F.cross_entropy(x, Y_IGNORED),
     lambda x: np_cross_entropy(x, Y_IGNORED), [randn(4, 3)]),
    ("cross_entropy_ignore_in_range", lambda x: F.cross_entropy(x, Y4, ignore_index=2),
     lambda x: np_cross_entropy(x, Y4, ignore_index=2), [randn(4, 3)]),
    ("cross_entropy_smoothing", lambda x: F.cross_entropy(x, Y4, label_smoothing=0.2),
     lambda x: np_cross_entropy(x, Y4, eps=0.2), [randn(4, 3)]),
    ("cross_entropy_all_three_nd",
     lambda x: F.cross_entropy(x, Y_ND_IGNORED, W3, ignore_index=7, label_smoothing=0.3),
     lambda x: np_cross_entropy(x, Y_ND_IGNORED, W3, 7, 0.3), [randn(2, 3, 2, 3)]),
    ("cross_entropy_all_three_none",
     lambda x: F.cross_entropy(x, Y_IGNORED, W3, reduction="none", label_smoothing=0.1),
     lambda x: np_cross_entropy(x, Y_IGNORED, W3, eps=0.1, reduction="none"), [randn(4, 3)]),
    ("cross_entropy_unbatched", lambda x: F.cross_entropy(x, np.array(1)),
     lambda x: -np_log_softmax(x, 0)[1], [randn(3)]),
    ("cross_entropy_probs", F.cross_entropy, np_cross_entropy_probs,
     [randn(4, 3), np_softmax(randn(4, 3), 1)]),
    ("cross_entropy_probs_nd_weight_smoothing",
     lambda x, t: F.cross_entropy(x, t, weight=const(W3), label_smoothing=0.2),
     lambda x, t: np_cross_entropy_probs(x, t, W3, 0.2), [randn(2, 3, 4), uniform(2, 3, 4)]),
    ("cross_entropy_probs_sum", lambda x, t: F.cross_entropy(x, t, reduction="sum"),
     lambda x, t: np_cross_entropy_probs(x, t, reduction="sum"), [randn(4, 3), uniform(4, 3)]),
    ("nll_loss", lambda x: F.nll_loss(x, Y4), lambda x: -x[np.arange(4), Y4].mean(),
     [randn(4, 3)]),
    ("nll_loss_weight_ignore",
     lambda x: F.nll_loss(x, Y_IGNORED, weight=const(W3)),
     lambda x: np_nll(x, Y_IGNORED, W3, -100), [randn(4, 3)]),
    ("nll_loss_nd_none", lambda x: F.nll_loss(x, Y_ND, reduction="none"),
     lambda x: -np.take_along_axis(x, Y_ND[:, None], 1)[:, 0], [randn(2, 3, 2, 3)]),
    # element-by-element losses
    ("mse_loss", F.mse_loss, lambda a, b: ((a - b) ** 2).mean(), [randn(3, 4), randn(3, 4)]),
    ("mse_loss_none", lambda a, b: F.mse_loss(a, b, reduction="none"),
     lambda a, b: (a - b) ** 2, [randn(3, 4), randn(3, 4)]),
    ("l1_loss", F.l1_loss, lambda a, b: np.abs(a - b).mean(), [randn(3, 4), randn(3, 4)]),
    ("l1_loss_sum", lambda a, b: F.l1_loss(a, b, reduction="sum"),
     lambda a, b: np.abs(a - b).sum(), [randn(3, 4), randn(3, 4)]),
    ("smooth_l1_loss", F.smooth_l1_loss,
     lambda a, b: np.where(np.abs(a - b) < 1, 0.5 * (a - b) ** 2, np.abs(a - b) - 0.5).mean(),
     [randn(3, 4) * 2, randn(3, 4)]),
    ("smooth_l1_loss_beta", lambda a, b: F.smooth_l1_loss(a, b, beta=0.5),
     lambda a, b: np.where(np.abs(a - b) < 0.5, (a - b) ** 2, np.abs(a - b) - 0.25).mean(),
     [randn(3, 4), randn(3, 4)]),
    ("smooth_l1_loss_beta0", lambda a, b: F.smooth_l1_loss(a, b, beta=0.0),
     lambda a, b: np.abs(a - b).mean(), [randn(3, 4), randn(3, 4)]),
    ("binary_cross_entropy", F.binary_cross_entropy,
     lambda x, y: -(y * np.log(x) + (1 - y) * np.log(1 - x)).mean(),
     [uniform(3, 4), uniform(3, 4)]),
    ("binary_cross_entropy_weight_sum",
     lambda x, y: F.binary_cross_entropy(x, y, weight=const(W3[None].repeat(2, 0)),
                                         reduction="sum"),
     lambda x, y: -(W3 * (y * np.log(x) + (1 - y) * np.log(1 - x))).sum(),
     [uniform(2, 3), uniform(2, 3)]),
    ("binary_cross_entropy_with_logits", F.binary_cross_entropy_with_logits,
     lambda x, y: -(y * np.log(np_sigmoid(x)) + (1 - y) * np.log(1 - np_sigmoid(x))).mean(),
     [randn(3, 4) * 3, uniform(3, 4)]),
    ("binary_cross_entropy_with_logits_pos_weight",
     lambda x, y: F.binary_cross_entropy_with_logits(x, y, weight=const(W3),
                                                     pos_weight=const(W3[::-1].copy())),
     lambda x, y: -(W3 * (W3[::-1] * y * np.log(np_sigmoid(x))
                          + (1 - y) * np.log(1 - np_sigmoid(x)))).mean(),
     [randn(4, 3) * 2, uniform(4, 3)]),
    # shapes and normalisation
    ("pad_constant", lambda x: F.pad(x, (1, 2, 0, 1)),
     lambda x: np_pad(x, (1, 2, 0, 1), "constant"), [randn(2, 3, 4)]),
    ("pad_value_negative_crops", lambda x: F.pad(x, (-1, 2), value=1.5),
     lambda x: np.concatenate([x[..., 1:], np.full(x.shape[:-1] + (2,), 1.5)], -1),
     [randn(3, 4)]),
    ("pad_reflect", lambda x: F.pad(x, (2, 1), mode="reflect"),
     lambda x: np_pad(x, (2, 1), "reflect"), [randn(2, 3, 4)]),
    ("pad_replicate_2d", lambda x: F.pad(x, (2, 1, 1, 3), mode="replicate"),
     lambda x: np_pad(x, (2, 1, 1, 3), "replicate"), [randn(1, 3, 4)]),
    ("pad_circular", lambda x: F.pad(x, (1, 3), mode="circular"),
     lambda x: np_pad(x, (1, 3), "circular"), [randn(2, 4)]),
    ("normalize", F.normalize,
     lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12), [randn(3, 4)]),
    ("normalize_p1_last", lambda x: F.normalize(x, p=1, dim=-1),
     lambda x: x / np.abs(x).sum(-1, keepdims=True), [randn(2, 3, 4)]),
    ("normalize_inf", lambda x: F.normalize(x, p=float("inf"), dim=0),
     lambda x: x / np.abs(x).max(0, keepdims=True), [randn(3, 4)]),
    ("layer_norm_int", lambda x: F.layer_norm(x, 5), lambda x: np_layer_norm(x, 1),
     [randn(3, 5)]),
    ("layer_norm_tuple_affine", lambda x, w, b: F.layer_norm(x, (3, 4), w, b, eps=1e-3),
     lambda x, w, b: np_layer_norm(x, 2, w, b, 1e-3), [randn(2, 3, 4), randn(3, 4), randn(3, 4)]),
    ("layer_norm_weight_only", lambda x, w: F.layer_norm(x, (4,), w),
     lambda x, w: np_layer_norm(x, 1, w, 0.0), [randn(3, 4), randn(4)]),
    ("embedding", lambda w: F.embedding(EMB_IDX, w), lambda w: w[EMB_IDX], [randn(5, 3)]),
    # attention
    ("sdpa", F.scaled_dot_product_attention, np_sdpa,
     [randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 2)]),
    ("sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     lambda q, k, v: np_sdpa(q, k, v, causal=True),
     [randn(2, 2, 4, 3), randn(2, 2, 4, 3), randn(2, 2, 4, 3)]),
    ("sdpa_bool_mask_scale",
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=const(MASK),
                                                    scale=0.3),
     lambda q, k, v: np_sdpa(q, k, v, MASK, scale=0.3),
     [randn(2, 3, 2), randn(2, 4, 2), randn(2, 4, 3)]),
    ("sdpa_float_mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
     lambda q, k, v, m: np_sdpa(q, k, v, m),
     [randn(3, 2), randn(4, 2), randn(4, 3), randn(3, 4)]),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("name,fn,ref,inputs", CASES, ids=IDS)
def test_forward_matches_numpy(name, fn, ref, inputs, float64):
    out = fn(*[sn.tensor(a) for a in inputs])
    np.testing.assert_allclose(out.numpy(), ref(*inputs), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,fn,ref,inputs", CASES, ids=IDS)
def test_backward_matches_finite_differences(name, fn, ref, inputs, float64):
    assert gradcheck(fn, *inputs)


def _grad(t):
    return backend.asnumpy(t.grad.array)


@pytest.mark.gpu
@pytest.mark.parametrize("name,fn,ref,inputs", CASES, ids=IDS)
def test_on_gpu_as_on_the_host(name, fn, ref, inputs, float64, monkeypatch):
    """Every case on CuPy arrays: the same values and gradients as NumPy's."""
    backend.require_cupy()
    results = []
    for device in ("cpu", "gpu"):
        monkeypatch.setitem(DEVICE, "now", device)
        ts = [sn.tensor(backend.to_device(a, device), requires_grad=True) for a in inputs]
        out = fn(*ts)
        weights = np.linspace(-1, 1, out.array.size).reshape(out.shape)
        (out * sn.tensor(backend.to_device(weights, device))).sum().backward()
        assert backend.device_of(out.array) == device
        results.append([backend.asnumpy(out.array)] + [_grad(t) for t in ts])
    for host, gpu in zip(*results, strict=True):
        np.testing.assert_allclose(gpu, host, rtol=1e-10, atol=1e-12)


# -- pinned by hand from PyTorch's documentation ------------------------------------------
def test_cross_entropy_weight_ignore_index_and_label_smoothing_by_hand(float64):
    """C = 3, weight (1, 2, 3), ε = 0.3: the target is (1-ε)·onehot + ε/3,
    l_n = Σ_c w_c·q_c·(-log p_c); "mean" divides by Σ w_{y_n} over the targets
    that are not ignored: w_0 + w_2 + w_1 = 6 here (row 2 is ignored)."""
    logits = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [5.0, -1.0, 2.0],
                       [math.log(1), math.log(2), math.log(5)]])
    target = np.array([0, 2, -100, 1])
    weight = sn.tensor([1.0, 2.0, 3.0])
    log3 = math.log(3)  # rows 0 and 1: p = 1/3 each
    row0 = (0.7 * 1 + 0.1 * (1 + 2 + 3)) * log3  # 1.3·log 3
    row1 = (0.7 * 3 + 0.1 * (1 + 2 + 3)) * log3  # 2.7·log 3
    # row 3: p = (1/8, 2/8, 5/8), target 1
    row3 = 0.7 * 2 * math.log(4) + 0.1 * (1 * math.log(8) + 2 * math.log(4)
                                          + 3 * math.log(8 / 5))
    got = {r: F.cross_entropy(sn.tensor(logits), target, weight, reduction=r,
                              label_smoothing=0.3).numpy() for r in ("mean", "sum", "none")}
    np.testing.assert_allclose(got["none"], [row0, row1, 0.0, row3], rtol=1e-12)
    np.testing.assert_allclose(got["sum"], row0 + row1 + row3, rtol=1e-12)
    np.testing.assert_allclose(got["mean"], (row0 + row1 + row3) / 6, rtol=1e-12)
    # the uniform rows alone: (1.3 + 2.7)·log 3 / (1 + 3) = log 3
    two = F.cross_entropy(sn.tensor(logits[:2]), target[:2], weight, label_smoothing=0.3)
    assert two.item() == pytest.approx(log3, rel=1e-12)


def test_cross_entropy_all_targets_ignored_is_nan_as_pytorch():
    with np.errstate(invalid="ignore", divide="ignore"):
        out = F.cross_entropy(sn.tensor(randn(2, 3)), np.array([-100, -100]))
    assert np.isnan(out.item())


def test_pad_pairs_start_at_the_last_dim():
    x = sn.tensor(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(F.pad(x, (1, 2)).numpy(),
                                  [[0, 0, 1, 2, 0, 0], [0, 3, 4, 5, 0, 0]])
    np.testing.assert_array_equal(F.pad(x, (0, 0, 1, 0), value=9).numpy(),
                                  [[9, 9, 9], [0, 1, 2], [3, 4, 5]])
    row = sn.tensor(np.arange(4.0)[None])
    np.testing.assert_array_equal(F.pad(row, (2, 1), mode="reflect").numpy(),
                                  [[2, 1, 0, 1, 2, 3, 2]])
    np.testing.assert_array_equal(F.pad(row, (2, 1), mode="replicate").numpy(),
                                  [[0, 0, 0, 1, 2, 3, 3]])
    np.testing.assert_array_equal(F.pad(row, (2, 1), mode="circular").numpy(),
                                  [[2, 3, 0, 1, 2, 3, 0]])


def test_activation_values_from_the_docs():
    x = sn.tensor([-2.0, 0.0, 3.0])
    np.testing.assert_allclose(F.leaky_relu(x).numpy(), [-0.02, 0.0, 3.0])
    np.testing.assert_allclose(F.elu(x).numpy(), [math.exp(-2) - 1, 0.0, 3.0], rtol=1e-6)
    # softplus is x itself above threshold / beta
    np.testing.assert_allclose(F.softplus(sn.tensor([30.0]), threshold=20).numpy(), [30.0])


# PyTorch 2.13's observed relu at the special values: -0.0 and NaN pass, the
# gradient passes at a NaN input, and a dead unit gives 0 even where the upstream
# gradient is inf or NaN (selected, not multiplied)
RELU_X = [-0.0, 0.0, np.nan, np.inf, -np.inf, -1.0, 1.0]
RELU_Y = [-0.0, 0.0, np.nan, np.inf, 0.0, 0.0, 1.0]
RELU_G = [np.nan, np.inf, np.nan, np.inf, np.nan, np.inf, np.nan]
RELU_GX = [0.0, 0.0, np.nan, np.inf, 0.0, 0.0, np.nan]


@pytest.mark.parametrize("mode", ["numba", "xp"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("path", ["relu", "sn.relu", "method", "linear_relu"])
def test_relu_special_values_as_pytorch(path, dtype, mode):
    with kernels.use(mode):
        x = sn.tensor(np.array(RELU_X, dtype), requires_grad=True)
        for g, want_gx in [(np.ones(7, dtype), [0, 0, 1, 1, 0, 0, 1]), (RELU_G, RELU_GX)]:
            x.grad = None
            if path == "linear_relu":  # the fused layer: in place over the product
                y = F.linear(x[:, None], sn.ones(1, 1, dtype=x.dtype), activation="relu")[:, 0]
            else:
                y = {"relu": F.relu, "sn.relu": sn.relu}.get(path, sn.Tensor.relu)(x)
            with np.errstate(invalid="ignore"):
                y.backward(sn.tensor(np.array(g, dtype)))
            assert y.dtype == x.dtype and x.grad.dtype == x.dtype
            np.testing.assert_array_equal(y.detach().numpy(), np.array(RELU_Y, dtype))
            if path != "linear_relu":  # there the product's sum decides -0.0's sign
                np.testing.assert_array_equal(np.signbit(y.detach().numpy()),
                                              np.signbit(RELU_Y))
            np.testing.assert_array_equal(x.grad.numpy(), np.array(want_gx, dtype))


def test_relu_keeps_integer_dtype():
    with kernels.use("xp"):
        y = F.relu(sn.tensor([-3, 0, 5]))
    assert y.dtype == sn.int64
    np.testing.assert_array_equal(y.numpy(), [0, 0, 5])


@pytest.mark.parametrize("relu_", [sn.relu_, sn.Tensor.relu_])
def test_relu_in_place_writes_pytorchs_values_where_the_tensor_lives(relu_):
    base = np.array(RELU_X + [-3.0], np.float32)
    view = sn.tensor(base)[1:]  # a view: the base array sees the write
    assert relu_(view) is view
    np.testing.assert_array_equal(view.numpy(), np.array(RELU_Y[1:] + [0.0], np.float32))
    np.testing.assert_array_equal(np.signbit(view.numpy()), np.signbit(RELU_Y[1:] + [0.0]))
    leaf = sn.tensor([-1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad.*relu_"):
        relu_(leaf)
    with sn.no_grad():
        relu_(leaf)
    np.testing.assert_array_equal(leaf.detach().numpy(), [0.0, 2.0])


# -- behaviour ----------------------------------------------------------------------------
def test_both_import_paths_are_one_module():
    assert F is F_OLD is F_FROM is sn.nn.functional is sn.functional
    assert importlib.import_module("spmdnet.nn.functional") is F


def test_softmax_without_dim_takes_pytorchs_implicit_dim_and_warns():
    x = randn(2, 3, 4)
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmax"):
        out = F.softmax(sn.tensor(x))
    np.testing.assert_allclose(out.numpy(), np_softmax(x, 0))  # 3-D: dim 0
    with pytest.warns(UserWarning):
        np.testing.assert_allclose(F.log_softmax(sn.tensor(x[0])).numpy(), np_log_softmax(x[0], 1))
    with pytest.raises(TypeError, match="both"):
        F.softmax(sn.tensor(x), dim=0, axis=1)


def test_softmax_dtype_casts_first():
    x = sn.tensor(randn(2, 3).astype(np.float32))
    assert F.softmax(x, -1, dtype=np.float64).dtype == np.float64


def test_cross_entropy_kernel_path_matches_the_xp_path():
    x = randn(16, 10).astype(np.float32)
    y = RNG.integers(0, 10, 16)
    grads = []
    for mode in ("numba", "xp"):
        with kernels.use(mode):
            for kwargs in ({}, {"ignore_index": 3}, {"ignore_index": 11}):
                t = sn.tensor(x, requires_grad=True)
                loss = F.cross_entropy(t, y, **kwargs)
                loss.backward()
                grads.append((loss.item(), t.grad.numpy() if hasattr(t.grad, "numpy")
                              else np.asarray(t.grad)))
    want = np_cross_entropy(x.astype(np.float64), y)
    for k, (value, grad) in enumerate(grads):
        if k % 3 == 1:  # ignore_index=3 drops those rows
            continue
        assert value == pytest.approx(want, rel=1e-5)
        np.testing.assert_allclose(grad, grads[0][1], rtol=1e-5, atol=1e-7)
    assert grads[1][0] == pytest.approx(np_cross_entropy(x.astype(np.float64), y, None, 3),
                                        rel=1e-5)


def test_embedding_padding_idx_gets_no_gradient(float64):
    w = sn.tensor(randn(5, 3), requires_grad=True)
    F.embedding(EMB_IDX, w, padding_idx=3).sum().backward()
    counts = np.bincount(EMB_IDX.ravel(), minlength=5).astype(float)
    counts[3] = 0
    np.testing.assert_array_equal(np.asarray(w.grad.numpy() if hasattr(w.grad, "numpy")
                                             else w.grad), counts[:, None].repeat(3, 1))


def test_one_hot_is_int64_and_infers_classes():
    out = F.one_hot(sn.tensor(np.array([[0, 2], [1, 0]])))
    assert out.dtype == np.int64 and out.shape == (2, 2, 3)
    np.testing.assert_array_equal(out.numpy()[0], [[1, 0, 0], [0, 0, 1]])
    assert F.one_hot(np.array([1]), num_classes=4).shape == (1, 4)


def test_dropout_and_sdpa_dropout():
    x = sn.tensor(np.ones((200, 50)))
    assert F.dropout(x, 0.3, training=False) is x
    kept = F.dropout(x, 0.3).numpy()
    assert set(np.unique(kept)) <= {0.0, 1 / 0.7} and abs((kept == 0).mean() - 0.3) < 0.03
    q = sn.tensor(randn(4, 6, 3))
    out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert out.shape == (4, 6, 3) and np.all(np.isfinite(out.numpy()))


ERRORS = [
    ("ce_target_out_of_bounds", IndexError, "target 3",
     lambda: F.cross_entropy(sn.tensor(randn(2, 3)), np.array([0, 3]))),
    ("ce_target_shape", ValueError, r"\(2, 3\).*\(3,\)",
     lambda: F.cross_entropy(sn.tensor(randn(2, 3)), np.array([0, 1, 2]))),
    ("ce_float_target_of_other_shape", TypeError, "integer",
     lambda: F.cross_entropy(sn.tensor(randn(2, 3)), np.array([0.0, 1.0]))),
    ("ce_weight_shape", ValueError, r"\(3,\)",
     lambda: F.cross_entropy(sn.tensor(randn(2, 3)), np.array([0, 1]), weight=np.ones(4))),
    ("ce_reduction", ValueError, "reduction",
     lambda: F.cross_entropy(sn.tensor(randn(2, 3)), np.array([0, 1]), reduction="avg")),
    ("ce_label_smoothing", ValueError, "label_smoothing",
     lambda: F.cross_entropy(sn.tensor(randn(2, 3)), np.array([0, 1]), label_smoothing=1.5)),
    ("bce_shape", ValueError, "same size",
     lambda: F.binary_cross_entropy(sn.tensor(uniform(2, 3)), uniform(3))),
    ("pad_odd", RuntimeError, "divisible by 2", lambda: F.pad(sn.tensor(randn(2, 3)), (1,))),
    ("pad_reflect_too_wide", RuntimeError, "at most 2",
     lambda: F.pad(sn.tensor(randn(2, 3)), (3, 0), mode="reflect")),
    ("one_hot_negative", RuntimeError, "non-negative", lambda: F.one_hot(np.array([-1, 0]))),
    ("one_hot_too_few_classes", RuntimeError, "smaller than num_classes",
     lambda: F.one_hot(np.array([3]), num_classes=3)),
    ("sdpa_mask_and_causal", RuntimeError, "not both",
     lambda: F.scaled_dot_product_attention(*[sn.tensor(randn(2, 2))] * 3,
                                            attn_mask=np.ones((2, 2), bool), is_causal=True)),
    ("layer_norm_old_signature", TypeError, "normalized_shape",
     lambda: F.layer_norm(sn.tensor(randn(2, 3)), sn.tensor(np.ones(3)))),
    ("layer_norm_shape", RuntimeError, r"\[\*, 4\]",
     lambda: F.layer_norm(sn.tensor(randn(2, 3)), 4)),
    ("dropout_p", ValueError, "between 0 and 1", lambda: F.dropout(sn.tensor(randn(2)), 1.5)),
    ("embedding_index", IndexError, "out of range",
     lambda: F.embedding(np.array([5]), sn.tensor(randn(5, 2)))),
]


@pytest.mark.parametrize("name,error,match,call", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_are_pytorchs(name, error, match, call):
    with pytest.raises(error, match=match):
        call()


def test_mse_loss_broadcasts_after_pytorchs_warning(float64):
    a, b = randn(3, 1), randn(3)
    with pytest.warns(UserWarning, match="target size"):
        out = F.mse_loss(sn.tensor(a), sn.tensor(b))
    np.testing.assert_allclose(out.item(), ((a - b) ** 2).mean())


def test_legacy_size_average_and_reduce_map_to_reduction():
    x, y = sn.tensor(randn(3, 4)), sn.tensor(randn(3, 4))
    with pytest.warns(UserWarning, match="reduction"):
        assert F.mse_loss(x, y, size_average=False).item() == pytest.approx(
            F.mse_loss(x, y, reduction="sum").item())
    with pytest.warns(UserWarning):
        assert F.l1_loss(x, y, reduce=False).shape == (3, 4)


# -- a PyTorch-style causal self-attention block ----------------------------------------------
N_HEAD = 2


def causal_self_attention(x, w_attn, b_attn, w_proj):
    """minGPT's CausalSelfAttention.forward, line for line (PyTorch code)."""
    B, T, C = x.size()  # noqa: N806 - PyTorch's names
    q, k, v = F.linear(x, w_attn, b_attn).split(C, dim=2)
    k = k.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)
    q = q.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)
    v = v.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)
    bias = sn.tril(sn.ones(T, T)).view(1, 1, T, T)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(bias[:, :, :T, :T] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    y = att @ v
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    return F.linear(y, w_proj)


def causal_self_attention_sdpa(x, w_attn, b_attn, w_proj):
    B, T, C = x.size()  # noqa: N806
    q, k, v = [t.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)
               for t in F.linear(x, w_attn, b_attn).split(C, dim=2)]
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(y.transpose(1, 2).contiguous().view(B, T, C), w_proj)


def np_causal_self_attention(x, w_attn, b_attn, w_proj):
    b, t, c = x.shape
    heads = [np.swapaxes(p.reshape(b, t, N_HEAD, c // N_HEAD), 1, 2)
             for p in np.split(x @ w_attn.T + b_attn, 3, axis=2)]
    y = np_sdpa(*heads, causal=True)
    return np.swapaxes(y, 1, 2).reshape(b, t, c) @ w_proj.T


ATTENTION_INPUTS = [randn(2, 3, 4), randn(12, 4) * 0.5, randn(12) * 0.1, randn(4, 4) * 0.5]


@pytest.mark.parametrize("block", [causal_self_attention, causal_self_attention_sdpa])
def test_pytorch_style_causal_attention_block(block, float64):
    out = block(*[sn.tensor(a) for a in ATTENTION_INPUTS])
    np.testing.assert_allclose(out.numpy(), np_causal_self_attention(*ATTENTION_INPUTS),
                               rtol=1e-10, atol=1e-12)
    assert gradcheck(block, *ATTENTION_INPUTS)


def test_masked_fill_matches_where_and_its_gradients():
    """masked_fill (a copy and a masked write) against where: values, the
    input's gradient exactly 0 where filled even for inf gradients, a
    tensor value's gradient the sum over filled places; a mask larger than
    the input broadcasts both, as where."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 4))
    mask = np.triu(np.ones((4, 4), bool), 1)[None, None]
    xt = sn.tensor(x, requires_grad=True)
    value = sn.tensor(-5.0, requires_grad=True)
    out = xt.masked_fill(sn.tensor(mask), value)
    np.testing.assert_array_equal(out.numpy(), np.where(mask, -5.0, x))
    g = rng.standard_normal(x.shape)
    g[0, 0, 0, 3] = np.inf  # a filled place: its gradient must stay exactly 0
    out.backward(sn.tensor(g))
    np.testing.assert_array_equal(xt.grad.numpy(), np.where(mask, 0.0, g))
    assert value.grad.item() == np.where(mask, g, 0.0).sum()
    big = sn.tensor(np.ones((4,))).masked_fill(sn.tensor(np.eye(4, dtype=bool)), 0.0)
    np.testing.assert_array_equal(big.numpy(), 1 - np.eye(4))


@pytest.mark.filterwarnings("ignore:Initializing zero-element")
def test_linear_on_empty_inputs_gives_pytorchs_shapes_and_gradients():
    """0 input features or 0 rows, with stacked leading dims (one GEMM over
    the flattened rows must not reshape with -1 there)."""
    layer = sn.nn.Linear(0, 3)
    x = sn.zeros(2, 4, 0, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert y.shape == (2, 4, 3) and x.grad.shape == (2, 4, 0)
    np.testing.assert_array_equal(layer.bias.grad.numpy(), [8.0] * 3)  # 2 x 4 rows of ones
    layer = sn.nn.Linear(3, 2)
    x = sn.zeros(0, 4, 3, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad.shape == (0, 4, 3)
    np.testing.assert_array_equal(layer.weight.grad.numpy(), np.zeros((2, 3)))
