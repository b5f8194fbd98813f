"""nn.Transformer and its encoder/decoder layers against the documented
equations written in NumPy here (in-projection, softmax(q kᵀ / sqrt(d) + mask) v
per head, out-projection, residuals with LayerNorm after or before each
block), the mask conventions (bool True = masked out, float added, key
padding (N, S)), hand-computed cases, and float64 finite differences."""
import math

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn
from spmdnet.autograd.finite_differences import central_differences
from spmdnet.nn.modules.transformer import _detect_is_causal

RNG = np.random.default_rng(0)
E, HEADS, FF = 8, 2, 12


# -- the oracle -------------------------------------------------------------------------------
def p(module, name):
    t = getattr(module, name)
    return None if t is None else t.numpy()


def np_layer_norm(x, norm):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + norm.eps) * p(norm, "weight") + p(norm, "bias")


def np_additive(mask):
    """bool True = masked out -> -inf; float masks as they are."""
    if mask is None:
        return 0.0
    return np.where(mask, -np.inf, 0.0) if mask.dtype == bool else mask


def np_attention(attn, q_in, kv_in, mask=None, pad=None):
    """Batch-major (N, L, E) query and (N, S, E) keys/values."""
    w, b = p(attn, "in_proj_weight"), p(attn, "in_proj_bias")
    q, k, v = (a @ w[i * E:(i + 1) * E].T + b[i * E:(i + 1) * E]
               for i, a in enumerate((q_in, kv_in, kv_in)))
    n, length, d = q.shape[0], q.shape[1], E // HEADS
    q, k, v = (a.reshape(n, -1, HEADS, d).transpose(0, 2, 1, 3) for a in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + np_additive(mask)
    if pad is not None:
        scores = scores + np_additive(pad)[:, None, None, :]
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = (weights @ v).transpose(0, 2, 1, 3).reshape(n, length, E)
    return out @ p(attn.out_proj, "weight").T + p(attn.out_proj, "bias")


def np_feed_forward(layer, x, act):
    h = x @ p(layer.linear1, "weight").T + p(layer.linear1, "bias")
    h = np.maximum(h, 0) if act == "relu" else act(h)
    return h @ p(layer.linear2, "weight").T + p(layer.linear2, "bias")


def np_encoder_layer(layer, x, act, mask=None, pad=None):
    def sa(y):
        return np_attention(layer.self_attn, y, y, mask, pad)
    if layer.norm_first:
        x = x + sa(np_layer_norm(x, layer.norm1))
        return x + np_feed_forward(layer, np_layer_norm(x, layer.norm2), act)
    x = np_layer_norm(x + sa(x), layer.norm1)
    return np_layer_norm(x + np_feed_forward(layer, x, act), layer.norm2)


def np_decoder_layer(layer, x, memory, act, tgt_mask=None, memory_pad=None):
    def sa(y):
        return np_attention(layer.self_attn, y, y, tgt_mask)

    def ca(y):
        return np_attention(layer.multihead_attn, y, memory, None, memory_pad)
    if layer.norm_first:
        x = x + sa(np_layer_norm(x, layer.norm1))
        x = x + ca(np_layer_norm(x, layer.norm2))
        return x + np_feed_forward(layer, np_layer_norm(x, layer.norm3), act)
    x = np_layer_norm(x + sa(x), layer.norm1)
    x = np_layer_norm(x + ca(x), layer.norm2)
    return np_layer_norm(x + np_feed_forward(layer, x, act), layer.norm3)


def np_gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


def randomize_norms(module):
    """LayerNorms start at ones/zeros; random values test that each norm is used where it is."""
    for name, t in module.named_parameters():
        if "norm" in name:
            t.array[...] = RNG.standard_normal(t.shape)


PAD = np.zeros((2, 5), bool)
PAD[1, 3:] = True
BOOL_CAUSAL = np.triu(np.ones((5, 5), bool), 1)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("act", ["relu", "gelu"])
@pytest.mark.parametrize("mask", ["none", "bool", "float"])
def test_encoder_matches_documented_equations(float64, norm_first, batch_first, act, mask):
    layer = nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, activation=act,
                                       batch_first=batch_first, norm_first=norm_first)
    encoder = nn.TransformerEncoder(layer, 2, nn.LayerNorm(E))
    randomize_norms(encoder)
    masks = {"none": None, "bool": BOOL_CAUSAL, "float": RNG.standard_normal((5, 5))}
    x = RNG.standard_normal((2, 5, E))  # batch-major
    want = x
    for each in encoder.layers:
        want = np_encoder_layer(each, want, "relu" if act == "relu" else np_gelu,
                                masks[mask], PAD)
    want = np_layer_norm(want, encoder.norm)
    given = x if batch_first else x.transpose(1, 0, 2)
    out = encoder(sn.tensor(given), mask=None if masks[mask] is None else sn.tensor(masks[mask]),
                  src_key_padding_mask=sn.tensor(PAD)).numpy()
    out = out if batch_first else out.transpose(1, 0, 2)
    np.testing.assert_allclose(out, want, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_matches_documented_equations(float64, norm_first):
    model = nn.Transformer(E, HEADS, 2, 2, FF, dropout=0.0, norm_first=norm_first,
                           batch_first=True)
    randomize_norms(model)
    src, tgt = RNG.standard_normal((2, 5, E)), RNG.standard_normal((2, 4, E))
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(4)
    memory = src
    for each in model.encoder.layers:
        memory = np_encoder_layer(each, memory, "relu", None, PAD)
    memory = np_layer_norm(memory, model.encoder.norm)
    want = tgt
    for each in model.decoder.layers:
        want = np_decoder_layer(each, want, memory, "relu", tgt_mask.numpy(), PAD)
    want = np_layer_norm(want, model.decoder.norm)
    out = model(sn.tensor(src), sn.tensor(tgt), tgt_mask=tgt_mask,
                src_key_padding_mask=sn.tensor(PAD), memory_key_padding_mask=sn.tensor(PAD),
                tgt_is_causal=True)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-11, atol=1e-12)


def test_generate_square_subsequent_mask_hand_written():
    mask = nn.Transformer.generate_square_subsequent_mask(3).numpy()
    inf = np.inf
    np.testing.assert_array_equal(mask, [[0, -inf, -inf], [0, 0, -inf], [0, 0, 0]])


def test_zero_blocks_leave_two_layer_norms(float64):
    """Hand-computed: with every linear weight and bias zero, both blocks add
    zero and a post-norm layer is LayerNorm(LayerNorm(x)): [1, 3] -> [-1, 1]."""
    layer = nn.TransformerEncoderLayer(2, 1, 3, dropout=0.0, layer_norm_eps=0.0)
    for name, t in layer.named_parameters():
        if "norm" not in name:
            t.array[...] = 0
    out = layer(sn.tensor([[[1.0, 3.0]]])).numpy()
    np.testing.assert_allclose(out, [[[-1.0, 1.0]]], rtol=1e-15)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masked_keys_do_not_reach_the_output(float64, kind):
    """Mask semantics: a key masked out (True, or -inf) for every query, and
    a padded key, change nothing when their values change."""
    layer = nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, batch_first=True)
    x = RNG.standard_normal((2, 5, E))
    mask = np.zeros((5, 5), bool)
    mask[:, 2] = True  # key 2 masked out for every query
    mask = sn.tensor(mask if kind == "bool" else np.where(mask, -np.inf, 0.0))
    base = layer(sn.tensor(x), src_mask=mask, src_key_padding_mask=sn.tensor(PAD)).numpy()
    y = x.copy()
    y[:, 2] += 5.0  # the masked key's own row changes, as its output must
    y[1, 3:] -= 7.0  # padded positions of sample 1
    moved = layer(sn.tensor(y), src_mask=mask, src_key_padding_mask=sn.tensor(PAD)).numpy()
    keep = [0, 1, 4]
    np.testing.assert_allclose(moved[0, keep], base[0, keep], rtol=1e-12)
    np.testing.assert_allclose(moved[1, [0, 1]], base[1, [0, 1]], rtol=1e-12)
    assert not np.allclose(moved[0, 2], base[0, 2])


def test_state_dict_keys_are_pytorchs():
    layer = nn.TransformerEncoderLayer(E, HEADS, FF)
    assert list(layer.state_dict()) == [
        "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
        "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
        "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"]
    decoder = nn.TransformerDecoderLayer(E, HEADS, FF, bias=False)
    assert [k for k in decoder.state_dict() if "multihead" in k or "norm3" in k] == [
        "multihead_attn.in_proj_weight", "multihead_attn.out_proj.weight", "norm3.weight"]
    model = nn.Transformer(E, HEADS, 1, 1, FF)
    keys = list(model.state_dict())
    assert keys[0] == "encoder.layers.0.self_attn.in_proj_weight"
    assert "encoder.norm.weight" in keys and "decoder.layers.0.norm3.bias" in keys


def test_encoder_copies_are_independent_and_transformer_xavier_init():
    layer = nn.TransformerEncoderLayer(E, HEADS, FF)
    encoder = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
    arrays = [each.linear1.weight.array for each in encoder.layers]
    assert all(a is not layer.linear1.weight.array for a in arrays)
    np.testing.assert_array_equal(arrays[0], arrays[2])  # deep copies of one layer
    model = nn.Transformer(64, 4, 1, 1, 256)
    bound = np.sqrt(6 / (64 + 256))  # xavier_uniform_ on linear1.weight (256, 64)
    w = model.encoder.layers[0].linear1.weight.numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_gradients_against_finite_differences(float64, norm_first):
    """Every parameter, the target and the memory, with a causal float mask
    and a memory padding mask."""
    layer = nn.TransformerDecoderLayer(4, 2, 6, dropout=0.0, activation=F.gelu,
                                       norm_first=norm_first)
    randomize_norms(layer)
    tgt, memory = (sn.tensor(RNG.standard_normal(s), requires_grad=True)
                   for s in ((3, 2, 4), (5, 2, 4)))
    weights = sn.tensor(RNG.standard_normal((3, 2, 4)))
    mask = nn.Transformer.generate_square_subsequent_mask(3)

    def loss():
        out = layer(tgt, memory, tgt_mask=mask, memory_key_padding_mask=sn.tensor(PAD),
                    tgt_is_causal=True)
        return (out * weights).sum()

    loss().backward()
    for t in [tgt, memory] + list(layer.parameters()):
        want = central_differences(lambda: loss().item(), t.array)
        np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-5, atol=1e-8)


def test_callable_activation_and_errors():
    layer = nn.TransformerEncoderLayer(E, HEADS, FF, activation=F.tanh, dropout=0.0)
    x = sn.randn(3, 2, E)
    assert layer(x).shape == (3, 2, E)
    with pytest.raises(RuntimeError, match="activation should be relu/gelu, not swish"):
        nn.TransformerEncoderLayer(E, HEADS, activation="swish")
    model = nn.Transformer(E, HEADS, 1, 1, FF)
    with pytest.raises(RuntimeError, match="batch number"):
        model(sn.randn(5, 2, E), sn.randn(4, 3, E))
    with pytest.raises(RuntimeError, match="d_model"):
        model(sn.randn(5, 2, E + 1), sn.randn(4, 2, E + 1))


def test_causal_hint_detected_from_the_mask_as_pytorch():
    """Without is_causal, a mask equal to the causal one (bool or float) is
    taken as causal; any other mask is not (then the mask itself is applied)."""
    causal = nn.Transformer.generate_square_subsequent_mask(4)
    assert _detect_is_causal(causal, None, 4)
    assert _detect_is_causal(sn.tensor(np.triu(np.ones((4, 4), bool), 1)), None, 4)
    assert not _detect_is_causal(sn.tensor(np.triu(np.ones((4, 4), bool), 2)), None, 4)
    assert not _detect_is_causal(causal, None, 5) and not _detect_is_causal(None, None, 4)
    assert not _detect_is_causal(causal, False, 4)
