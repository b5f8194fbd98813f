"""scaled_dot_product_attention (one op, ops/attention.py; its dropout in
kernels/attention.py) and nn.MultiheadAttention against plain-NumPy
references and float64 finite differences."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import kernels, nn
from spmdnet.autograd import gradcheck
from spmdnet.kernels import attention as katt
from spmdnet.ops.attention import ScaledDotProductAttention

RNG = np.random.default_rng(0)


def randn(*shape):
    return RNG.standard_normal(shape)


def np_sdpa(q, k, v, mask=None, causal=False, scale=None, keep=None, p=0.0):
    """The textbook formula in NumPy; ``keep`` (…, L, S) is the dropout mask."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    if keep is not None:
        w = w * keep / (1 - p)
    return w @ v


BOOL = RNG.random((5, 6)) > 0.3
BOOL[:, 0] = True  # no row fully masked
PAD = np.ones((2, 1, 1, 6), bool)
PAD[1, ..., 4:] = False
# (name, kwargs of F.sdpa and np_sdpa, shapes of q, k, v)
CASES = [
    ("plain", {}, [(2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 3)]),
    ("causal_square", {"causal": True}, [(2, 2, 7, 3), (2, 2, 7, 3), (2, 2, 7, 2)]),
    ("causal_L_lt_S", {"causal": True}, [(1, 2, 4, 3), (1, 2, 6, 3), (1, 2, 6, 3)]),
    ("causal_L_gt_S", {"causal": True}, [(2, 5, 3), (2, 3, 3), (2, 3, 2)]),
    ("bool_mask", {"mask": BOOL}, [(2, 2, 5, 3), (2, 2, 6, 3), (2, 2, 6, 3)]),
    ("padding_mask", {"mask": PAD}, [(2, 3, 5, 3), (2, 3, 6, 3), (2, 3, 6, 4)]),
    ("float_mask", {"mask": randn(2, 1, 5, 6)}, [(2, 3, 5, 3), (2, 3, 6, 3), (2, 3, 6, 3)]),
    ("broadcast_batch_scale", {"scale": 0.7}, [(2, 3, 5, 4), (3, 6, 4), (1, 3, 6, 2)]),
    ("unbatched", {"causal": True}, [(4, 3), (4, 3), (4, 5)]),
]
IDS = [c[0] for c in CASES]


def call(q, k, v, mask=None, causal=False, scale=None, dropout_p=0.0):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          scale=scale, dropout_p=dropout_p)


@pytest.mark.parametrize("mode", ["numba", "xp"])
@pytest.mark.parametrize("name,kw,shapes", CASES, ids=IDS)
def test_forward_matches_numpy(name, kw, shapes, mode, float64):
    arrays = [randn(*s) for s in shapes]
    with kernels.use(mode):
        out = call(*[sn.tensor(a) for a in arrays], **kw)
    np.testing.assert_allclose(out.numpy(), np_sdpa(*arrays, **kw), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("block", [1, 3, 64])
def test_blocks_not_dividing_length(block, float64):
    q, k, v = randn(2, 7, 3), randn(2, 9, 3), randn(2, 9, 2)
    op = sn.ops.attention.ScaledDotProductAttention
    t = [sn.tensor(a, requires_grad=True) for a in (q, k, v)]
    mask = RNG.random((7, 9)) > 0.4
    mask[:, 0] = True
    with kernels.use("xp"):
        out = op.apply(*t, mask=mask, causal=False, scale=0.5, block_rows=block)
    np.testing.assert_allclose(out.numpy(), np_sdpa(q, k, v, mask, scale=0.5), rtol=1e-12)
    assert gradcheck(lambda a, b, c: op.apply(a, b, c, causal=True, scale=0.5,
                                              block_rows=block), q, k, v)


@pytest.mark.parametrize("mode", ["numba", "xp"])
@pytest.mark.parametrize("name,kw,shapes", CASES, ids=IDS)
def test_backward_matches_finite_differences(name, kw, shapes, mode, float64):
    arrays = [randn(*s) for s in shapes]
    with kernels.use(mode):
        assert gradcheck(lambda q, k, v: call(q, k, v, **kw), *arrays)


def test_float_mask_gradient(float64):
    """A float mask that needs a gradient gets one (broadcast rows and batch)."""
    for mshape in [(5, 6), (2, 1, 1, 6), (6,)]:
        assert gradcheck(lambda q, k, v, m: call(q, k, v, mask=m),
                         randn(2, 2, 5, 3), randn(2, 2, 6, 3), randn(2, 2, 6, 2),
                         randn(*mshape))


def test_philox_known_answer():
    """Random123's known answer: Philox4x32-10, counter 0 and key 0."""
    assert int(katt.philox(np.uint64(0), np.uint64(0), np.uint64(0))) == 0x6627E8D5
    index = np.arange(5, dtype=np.uint64)
    words = katt.philox(index, np.uint64(1), np.uint64(2))
    assert [int(katt.philox(i, np.uint64(1), np.uint64(2))) for i in index] == list(words)


def keep_after(seed, shape, p):
    """PyTorch's CPU mask right after sn.manual_seed(seed): bernoulli_(1 - p)
    over the weights, one float64 uniform each (tests/test_attention_dropout_rng.py
    holds PyTorch's own numbers)."""
    sn.manual_seed(seed)
    return (sn.rand(int(np.prod(shape)), dtype=sn.float64).numpy() < 1 - p).reshape(shape)


@pytest.mark.parametrize("mode", ["numba", "xp"])
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_forward_and_backward(mode, causal, float64):
    q, k, v, p = randn(2, 3, 6, 4), randn(2, 3, 6, 4), randn(2, 3, 6, 3), 0.3
    keep = keep_after(7, (2, 3, 6, 6), p)
    assert 0.4 < keep.mean() < 0.9
    with kernels.use(mode):
        sn.manual_seed(7)
        out = call(*[sn.tensor(a) for a in (q, k, v)], causal=causal, dropout_p=p)
        np.testing.assert_allclose(out.numpy(), np_sdpa(q, k, v, causal=causal, keep=keep,
                                                        p=p), rtol=1e-10, atol=1e-12)

        def fn(a, b, c):
            sn.manual_seed(7)
            return call(a, b, c, causal=causal, dropout_p=p)
        assert gradcheck(fn, q, k, v)


@pytest.mark.parametrize("causal", [False, True])
def test_seeded_philox_dropout_forward_and_backward(causal, float64):
    """The GPU's mask (a Philox stream from a seed, regenerated in backward),
    run here through the op itself on NumPy arrays."""
    q, k, v, p, seed = randn(2, 3, 6, 4), randn(2, 3, 6, 4), randn(2, 3, 6, 3), 0.3, 2**40 + 17
    keep = katt.dropout_keep(np, (6, 6, 6), range(6), seed, p).reshape(2, 3, 6, 6)
    assert 0.4 < keep.mean() < 0.9

    def fn(a, b, c):
        return ScaledDotProductAttention.apply(a, b, c, causal=causal, scale=0.5, dropout_p=p,
                                               seed=seed, block_rows=4)
    out = fn(*[sn.tensor(a) for a in (q, k, v)])
    np.testing.assert_allclose(out.numpy(), np_sdpa(q, k, v, causal=causal, scale=0.5,
                                                    keep=keep, p=p), rtol=1e-10, atol=1e-12)
    assert gradcheck(fn, q, k, v)


def test_dropout_rate_and_streams():
    x = sn.tensor(np.ones((1, 64, 8), np.float32))
    a = call(x, x, x, dropout_p=0.25)
    b = call(x, x, x, dropout_p=0.25)
    assert not np.array_equal(a.numpy(), b.numpy())  # the seed advances
    keep = katt.dropout_keep(np, (4, 64, 64), range(64), 123, 0.25)
    assert abs(keep.mean() - 0.75) < 0.02


@pytest.mark.parametrize("mode", ["numba", "xp"])
def test_saves_no_scores(mode):
    """Forward keeps q, k, v, the output, one statistic per row and, with
    dropout, the mask's bits: no (…, L, S) array, whatever the mask."""
    b, h, length, source, e = 2, 3, 11, 13, 4
    t = [sn.tensor(randn(b, h, n, e).astype(np.float32), requires_grad=True)
         for n in (length, source, source)]
    for kw in [{"causal": True, "dropout_p": 0.2}, {"mask": np.ones((length, source), bool)}]:
        with kernels.use(mode):
            out = call(*t, **kw)
        ctx = out._ctx
        arrays = [a for a in vars(ctx).values() if hasattr(a, "shape") and hasattr(a, "dtype")
                  and a is not kw.get("mask")]  # the user's own mask is kept, not copied
        assert all(a.shape[-2:] != (length, source) for a in arrays if a.ndim >= 2)
        lse = ctx.lse
        assert lse.shape == (b * h, length) and lse.dtype == np.float32
        saved = sum(a.nbytes for a in arrays)
        mask_bits = b * h * length * -(-source // 8) if kw.get("dropout_p") else 0
        assert saved <= sum(x.array.nbytes for x in t) + out.array.nbytes + lse.nbytes + 64 \
            + mask_bits
        out.sum().backward()
        assert all(x.grad.dtype == np.float32 for x in t)


# -- nn.MultiheadAttention against a hand-written composition ---------------------------------
def np_mha(state, q, k, v, heads, kpm=None, attn_mask=None, average=True):
    """Batch-first (N, L, E) NumPy reference; masks True = masked out."""
    state = {k: np.asarray(v) for k, v in state.items()}  # state_dict() holds Tensors
    w, b = state["in_proj_weight"], state["in_proj_bias"]
    e = q.shape[-1]
    qp, kp, vp = (x @ w[i * e:(i + 1) * e].T + b[i * e:(i + 1) * e]
                  for i, x in enumerate((q, k, v)))
    n, length, source, d = q.shape[0], q.shape[1], k.shape[1], e // heads
    split = lambda x, t: x.reshape(n, t, heads, d).transpose(0, 2, 1, 3)  # noqa: E731
    s = split(qp, length) @ split(kp, source).transpose(0, 1, 3, 2) / np.sqrt(d)
    if attn_mask is not None:
        m = attn_mask.reshape(n, heads, length, source) if attn_mask.ndim == 3 else attn_mask
        s = np.where(m, -np.inf, s) if m.dtype == bool else s + m
    if kpm is not None:
        s = np.where(kpm[:, None, None, :], -np.inf, s)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = (a @ split(vp, source)).transpose(0, 2, 1, 3).reshape(n, length, e)
    return o @ state["out_proj.weight"].T + state["out_proj.bias"], (a.mean(1) if average
                                                                     else a)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("masks", ["none", "padding", "bool_attn", "float_attn3d", "both"])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_multihead_attention(batch_first, masks, need_weights, average, float64):
    n, length, source, e, heads = 2, 4, 5, 6, 3
    sn.manual_seed(1)
    mha = nn.MultiheadAttention(e, heads, batch_first=batch_first)
    state = mha.state_dict()
    q, k, v = randn(n, length, e), randn(n, source, e), randn(n, source, e)
    kpm = attn = None
    if masks in ("padding", "both"):
        kpm = np.zeros((n, source), bool)
        kpm[1, 3:] = True
    if masks in ("bool_attn", "both"):
        attn = ~BOOL[:length, :source]
    if masks == "float_attn3d":
        attn = randn(n * heads, length, source)
    want, want_w = np_mha(state, q, k, v, heads, kpm, attn, average)
    order = (lambda x: x) if batch_first else (lambda x: x.transpose(1, 0, 2))
    out, weights = mha(*[sn.tensor(order(x)) for x in (q, k, v)], key_padding_mask=kpm,
                       attn_mask=attn, need_weights=need_weights,
                       average_attn_weights=average)
    np.testing.assert_allclose(out.numpy(), order(want), rtol=1e-10, atol=1e-12)
    if need_weights:
        np.testing.assert_allclose(weights.numpy(), want_w, rtol=1e-10, atol=1e-12)
    else:
        assert weights is None


def test_multihead_attention_params_grads_and_causal(float64):
    e, heads = 8, 2
    sn.manual_seed(3)
    mha = nn.MultiheadAttention(e, heads, batch_first=True)
    assert list(mha.state_dict()) == ["in_proj_weight", "in_proj_bias", "out_proj.weight",
                                      "out_proj.bias"]
    assert mha.in_proj_weight.shape == (3 * e, e)
    bound = np.sqrt(6 / (4 * e))  # xavier_uniform_ over the (3E, E) matrix
    assert np.abs(mha.in_proj_weight.numpy()).max() <= bound
    assert not mha.in_proj_bias.numpy().any() and not mha.out_proj.bias.numpy().any()
    x = sn.tensor(randn(2, 5, e))
    causal = np.triu(np.ones((5, 5), bool), 1)
    grads = []
    for need_weights in (True, False):  # composition and fused op: same values and grads
        mha.zero_grad()
        out, _ = mha(x, x, x, attn_mask=causal, is_causal=True, need_weights=need_weights)
        out.sum().backward()
        grads.append([p.grad.numpy().copy() for p in mha.parameters()] + [out.numpy()])
    for a, b in zip(*grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    want, _ = np_mha(mha.state_dict(), x.numpy(), x.numpy(), x.numpy(), heads,
                     attn_mask=causal)
    np.testing.assert_allclose(grads[1][-1], want, rtol=1e-10)
    unbatched, w = mha(x[0], x[0], x[0])
    np.testing.assert_allclose(unbatched.numpy(), mha(x, x, x)[0].numpy()[0], rtol=1e-10)
    assert w.shape == (5, 5)
    with pytest.raises(RuntimeError, match="needs attn_mask"):
        mha(x, x, x, is_causal=True)
    with pytest.raises(ValueError, match="divisible"):
        nn.MultiheadAttention(7, 2)
