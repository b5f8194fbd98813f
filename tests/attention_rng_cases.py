"""Seeded attention dropout compared with PyTorch's (tests/test_attention_dropout_rng.py):
each case is ``fn(t, seed) -> list of arrays`` written once against the
PyTorch API, run with ``t = spmdnet`` by the tests and with ``t = torch``
(outside the project) by the script that wrote
tests/fixtures/torch_rng/attention.npz (see that folder's README.md).

Each case returns outputs and gradients (equal to float rounding) and the
next draws after the forward, ``_next(t)`` (int64, equal exactly: the
attention drew as many numbers, in the same order, as PyTorch's)."""
import numpy as np

SEEDS = (0, 7)
CASES = {}
TOL = {np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-12}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def arr(x):
    if hasattr(x, "detach"):
        return np.asarray(x.detach().numpy())
    return np.asarray(x)


def _next(t):
    return t.randint(0, 2**62, (3,))


def _leaf(t, rng, shape, dtype):
    return t.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


def _weighted_sum(t, out, rng, dtype):
    """A loss whose gradient differs per element (a plain sum would hide a
    permuted mask in the value gradient's row sums)."""
    return (out * t.tensor(rng.standard_normal(tuple(out.shape)).astype(dtype))).sum()


SDPA_CONFIGS = [  # query, key, value shapes; mask: None, "bool", "float", "causal"
    ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 3), None),
    ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 3), "bool"),
    ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 3), "float"),
    ((2, 3, 6, 4), (2, 3, 6, 4), (2, 3, 6, 3), "causal"),
    ((5, 4), (7, 4), (7, 2), None),
    ((3, 9, 5), (3, 11, 5), (3, 11, 5), "bool"),
    ((2, 1, 4, 3), (1, 3, 5, 3), (1, 3, 5, 2), None),
    ((1, 4, 3), (1, 5, 3), (2, 5, 2), None),  # value broadcasts further: masks over q kᵀ only
    ((4, 3), (5, 3), (3, 2, 5, 2), "float"),
]


@case
def sdpa(t, seed):
    """F.scaled_dot_product_attention(dropout_p=0.3): float32 and float64,
    every mask kind, broadcast leading dims; then p = 1 (draws nothing)."""
    out = []
    for dtype in ("float32", "float64"):
        for qs, ks, vs, kind in SDPA_CONFIGS:
            rng = np.random.default_rng(len(out))
            q, k, v = (_leaf(t, rng, s, dtype) for s in (qs, ks, vs))
            leaves, mask = [q, k, v], None
            if kind == "bool":
                allowed = rng.random(qs[-2:-1] + ks[-2:-1]) > 0.3
                allowed[:, 0] = True
                mask = t.tensor(allowed)
            elif kind == "float":
                mask = _leaf(t, rng, qs[:-1] + ks[-2:-1], dtype)
                leaves.append(mask)
            t.manual_seed(seed)
            y = t.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=0.3, is_causal=kind == "causal")
            after = _next(t)
            _weighted_sum(t, y, rng, dtype).backward()
            out += [arr(y), arr(after)] + [arr(x.grad) for x in leaves]
    q = t.ones(2, 4, 3)
    t.manual_seed(seed)
    out += [arr(t.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=1.0)),
            arr(_next(t))]
    return out


@case
def multihead_attention(t, seed):
    """nn.MultiheadAttention(dropout=0.4) in train mode: need_weights True
    (the weights, after dropout, come back) and False, with masks."""
    out = []
    for dtype, need, batch_first, masks in [
            ("float32", True, False, False), ("float32", False, False, False),
            ("float64", True, True, True), ("float64", False, True, True),
            ("float32", False, False, True)]:
        t.manual_seed(seed)
        m = t.nn.MultiheadAttention(8, 2, dropout=0.4, batch_first=batch_first,
                                    dtype=getattr(t, dtype))
        rng = np.random.default_rng(len(out))
        shape = (3, 5, 8) if batch_first else (5, 3, 8)
        x = _leaf(t, rng, shape, dtype)
        kwargs = {"need_weights": need}
        if masks:
            pad = np.zeros((3, 5), bool)
            pad[1, 3:] = True
            kwargs.update(key_padding_mask=t.tensor(pad),
                          attn_mask=t.tensor(np.triu(np.ones((5, 5), bool), 1)))
        y, weights = m(x, x, x, **kwargs)
        after = _next(t)
        _weighted_sum(t, y, rng, dtype).backward()
        out += [arr(y), arr(after), arr(x.grad), arr(m.in_proj_weight.grad)]
        if need:
            out.append(arr(weights))
    return out


@case
def encoder_layer(t, seed):
    """nn.TransformerEncoderLayer in train mode: attention dropout, then
    dropout1, the feed-forward's dropout, dropout2; post- and pre-norm,
    causal with a padding mask."""
    out = []
    for norm_first, causal in [(False, False), (True, True)]:
        t.manual_seed(seed)
        layer = t.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.25, norm_first=norm_first)
        rng = np.random.default_rng(len(out))
        x = _leaf(t, rng, (6, 2, 8), "float32")
        kwargs = {}
        if causal:
            pad = np.zeros((2, 6), bool)
            pad[0, 4:] = True
            kwargs = {"src_mask": t.tensor(np.triu(np.ones((6, 6), bool), 1)),
                      "is_causal": True, "src_key_padding_mask": t.tensor(pad)}
        y = layer(x, **kwargs)
        after = _next(t)
        _weighted_sum(t, y, rng, "float32").backward()
        out += [arr(y), arr(after), arr(x.grad), arr(layer.self_attn.in_proj_weight.grad),
                arr(layer.linear1.weight.grad)]
    return out


def encoder_training_losses(t, seed=0, steps=3):
    """Three SGD steps of a 2-layer TransformerEncoder with dropout, a
    linear head and cross-entropy, seeded once: the losses."""
    t.manual_seed(seed)
    layer = t.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.3)
    encoder = t.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    head = t.nn.Linear(8, 4)
    opt = t.optim.SGD(list(encoder.parameters()) + list(head.parameters()), lr=0.1)
    rng = np.random.default_rng(1)
    x = t.tensor(rng.standard_normal((7, 3, 8)).astype(np.float32))
    target = t.tensor(rng.integers(0, 4, (7 * 3,)))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = t.nn.functional.cross_entropy(head(encoder(x)).reshape(-1, 4), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses), arr(_next(t))
