"""nn.RNN, nn.LSTM, nn.GRU and their cells against PyTorch's documented
equations written step by step in NumPy here (gate order i, f, g, o and
r, z, n with b_hn inside r * (...)), a hand-computed one-step case, and
float64 finite differences for every gradient (inputs, states, weights)."""
import numpy as np
import pytest

import spmdnet as sn
from spmdnet import nn
from spmdnet.autograd import gradcheck
from spmdnet.autograd.finite_differences import central_differences
from spmdnet.ops.rnn import ElmanSequence, GRUSequence, LSTMSequence

RNG = np.random.default_rng(0)


def sigmoid(a):
    return 1 / (1 + np.exp(-a))


# -- the oracle: one step of each cell as PyTorch's documentation writes it -----------------
def np_cell(mode, x, state, w_ih, w_hh, b_ih, b_hh):
    """One step for a batch: x (N, I), state h or (h, c); returns h or (h, c)."""
    if mode == "LSTM":
        h, c = state
        i, f, g, o = np.split(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh, 4, axis=-1)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        return sigmoid(o) * np.tanh(c), c
    if mode == "GRU":
        xr, xz, xn = np.split(x @ w_ih.T + b_ih, 3, axis=-1)
        hr, hz, hn = np.split(state @ w_hh.T + b_hh, 3, axis=-1)
        r, z = sigmoid(xr + hr), sigmoid(xz + hz)
        n = np.tanh(xn + r * hn)
        return (1 - z) * n + z * state
    pre = x @ w_ih.T + b_ih + state @ w_hh.T + b_hh
    return np.tanh(pre) if mode == "RNN_TANH" else np.maximum(pre, 0)


def np_stack(module, x, h0, c0=None):
    """The whole module, time-major x (T, N, I): (output, h_n, c_n)."""
    mode, size = module.mode, module.hidden_size
    directions = 2 if module.bidirectional else 1
    h_n, c_n = [], []
    for layer in range(module.num_layers):
        outs = []
        for d, suffix in enumerate(["", "_reverse"][:directions]):
            names = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
            w = [getattr(module, f"{n}_l{layer}{suffix}", None) for n in names]
            w = [np.zeros(w[0].shape[0]) if a is None else a.numpy() for a in w]
            k = layer * directions + d
            state = (h0[k], c0[k]) if mode == "LSTM" else h0[k]
            ys = np.zeros((x.shape[0], x.shape[1], size))
            for t in (range(x.shape[0] - 1, -1, -1) if d else range(x.shape[0])):
                state = np_cell(mode, x[t], state, *w)
                ys[t] = state[0] if mode == "LSTM" else state
            outs.append(ys)
            h_n.append(state[0] if mode == "LSTM" else state)
            c_n.append(state[1] if mode == "LSTM" else None)
        x = np.concatenate(outs, axis=-1)
    return x, np.stack(h_n), (np.stack(c_n) if mode == "LSTM" else None)


MODULES = {"rnn_tanh": lambda **kw: nn.RNN(3, 4, **kw),
           "rnn_relu": lambda **kw: nn.RNN(3, 4, nonlinearity="relu", **kw),
           "lstm": lambda **kw: nn.LSTM(3, 4, **kw), "gru": lambda **kw: nn.GRU(3, 4, **kw)}
CONFIGS = [{}, {"num_layers": 2, "bidirectional": True}, {"batch_first": True, "bias": False},
           {"num_layers": 3, "batch_first": True, "bidirectional": True}]


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("kind", MODULES)
def test_module_matches_documented_equations(float64, kind, config):
    module = MODULES[kind](**config)
    directions = 2 if config.get("bidirectional") else 1
    layers = config.get("num_layers", 1)
    x = RNG.standard_normal((5, 2, 3))
    h0 = RNG.standard_normal((directions * layers, 2, 4))
    c0 = RNG.standard_normal(h0.shape)
    want, want_h, want_c = np_stack(module, x, h0, c0)
    given = np.swapaxes(x, 0, 1) if config.get("batch_first") else x
    hx = (sn.tensor(h0), sn.tensor(c0)) if kind == "lstm" else sn.tensor(h0)
    out, state = module(sn.tensor(given), hx)
    out = np.swapaxes(out.numpy(), 0, 1) if config.get("batch_first") else out.numpy()
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    h_n = state[0] if kind == "lstm" else state
    np.testing.assert_allclose(h_n.numpy(), want_h, rtol=1e-12, atol=1e-12)
    if kind == "lstm":
        np.testing.assert_allclose(state[1].numpy(), want_c, rtol=1e-12, atol=1e-12)
    assert out.shape == (5, 2, directions * 4)


def test_lstm_hand_computed_step(float64):
    """H = 1, I = 1, all weights 0.5, biases 0, x = 1, h0 = 0, c0 = 1: every
    gate's pre-activation is 0.5 (i, f, o = σ(0.5), g = tanh(0.5))."""
    lstm = nn.LSTM(1, 1, bias=False)
    for p in lstm.parameters():
        p.array[...] = 0.5
    out, (h, c) = lstm(sn.tensor([[[1.0]]]), (sn.zeros(1, 1, 1), sn.ones(1, 1, 1)))
    s, g = 1 / (1 + np.exp(-0.5)), np.tanh(0.5)
    c_want = s * 1.0 + s * g
    assert c.item() == pytest.approx(c_want, rel=1e-14)
    assert h.item() == pytest.approx(s * np.tanh(c_want), rel=1e-14)
    assert out.item() == h.item()


def test_rnn_hand_computed_two_steps(float64):
    """H = I = 1, weights 0.5, biases 0.25 each, x = (1, -2), h0 = 0:
    h1 = tanh(0.5 + 0.5), h2 = tanh(-1 + 0.5 h1 + 0.5); relu clips h2 at 0."""
    for nonlinearity, act in (("tanh", np.tanh), ("relu", lambda v: max(v, 0.0))):
        rnn = nn.RNN(1, 1, nonlinearity=nonlinearity)
        for p in rnn.parameters():
            p.array[...] = 0.5 if p.ndim == 2 else 0.25
        out = rnn(sn.tensor([[[1.0]], [[-2.0]]]))[0].numpy().ravel()
        h1 = act(1.0)
        assert out[0] == pytest.approx(h1, rel=1e-14)
        assert out[1] == pytest.approx(act(-1.0 + 0.5 * h1 + 0.5), rel=1e-14, abs=1e-300)


def test_gru_hand_computed_step(float64):
    """All weights 1, b_hn = 1, other biases 0, x = 1, h0 = 0: r = z = σ(1),
    n = tanh(1 + r · (0 + 1)); h = (1 - z) n; b_hn inside r · (...) is what
    distinguishes PyTorch's GRU from the variant adding b_hn outside."""
    gru = nn.GRU(1, 1)
    for p in gru.parameters():
        p.array[...] = 1.0
    gru.bias_ih_l0.array[...] = 0
    gru.bias_hh_l0.array[:2] = 0
    h = gru(sn.tensor([[[1.0]]]))[1].item()
    s = 1 / (1 + np.exp(-1.0))
    assert h == pytest.approx((1 - s) * np.tanh(1 + s), rel=1e-14)


@pytest.mark.parametrize("kind", MODULES)
def test_parameters_names_shapes_and_init(kind):
    module = MODULES[kind](num_layers=2, bidirectional=True)
    gates = {"lstm": 4, "gru": 3}.get(kind, 1) * 4
    shapes = dict((name, tuple(p.shape)) for name, p in module.named_parameters())
    assert list(shapes)[:5] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
                                "weight_ih_l0_reverse"]
    assert shapes["weight_ih_l0"] == (gates, 3) and shapes["weight_ih_l1"] == (gates, 8)
    assert shapes["weight_hh_l1_reverse"] == (gates, 4) and shapes["bias_hh_l1"] == (gates,)
    assert len(shapes) == 16 and list(module.state_dict()) == list(shapes)
    values = np.concatenate([p.numpy().ravel() for p in module.parameters()])
    assert np.abs(values).max() <= 0.5 and np.abs(values).max() > 0.45  # U(±1/sqrt(4))
    assert len(module.all_weights) == 4 and module.flatten_parameters() is None


SEQUENCES = {
    "elman_tanh": (lambda xw, h0, w: ElmanSequence.apply(xw, h0, w), 1),
    "elman_relu": (lambda xw, h0, w: ElmanSequence.apply(xw, h0, w, nonlinearity="relu"), 1),
    "lstm": (lambda xw, h0, c0, w: LSTMSequence.apply(xw, h0, c0, w), 4),
    "lstm_reverse": (lambda xw, h0, c0, w: LSTMSequence.apply(xw, h0, c0, w, reverse=True), 4),
    "gru": (lambda xw, h0, w, b: GRUSequence.apply(xw, h0, w, b), 3),
    "gru_reverse": (lambda xw, h0, w, b: GRUSequence.apply(xw, h0, w, b, reverse=True), 3),
}


@pytest.mark.parametrize("name", SEQUENCES)
def test_recurrence_ops_gradcheck(name):
    fn, gates = SEQUENCES[name]
    t, n, h = 4, 2, 3
    arrays = [RNG.standard_normal((t, n, gates * h)), RNG.standard_normal((n, h))]
    if name.startswith("lstm"):
        arrays.append(RNG.standard_normal((n, h)))
    arrays.append(RNG.standard_normal((gates * h, h)) * 0.6)
    if name.startswith("gru"):
        arrays.append(RNG.standard_normal(gates * h))
    gradcheck(fn, *arrays)


@pytest.mark.parametrize("kind", MODULES)
def test_module_gradients_against_finite_differences(float64, kind):
    """Every parameter, the input and the initial states, through two
    bidirectional layers with batch_first, for a loss on output and final states."""
    module = MODULES[kind](num_layers=2, bidirectional=True, batch_first=True)
    x, h0, c0 = (sn.tensor(RNG.standard_normal(s), requires_grad=True)
                 for s in ((2, 3, 3), (4, 2, 4), (4, 2, 4)))
    w_out, w_h = RNG.standard_normal((2, 3, 8)), RNG.standard_normal((4, 2, 4))

    def loss():
        out, state = module(x, (h0, c0) if kind == "lstm" else h0)
        last = state[0] * state[1] if kind == "lstm" else state
        return (out * sn.tensor(w_out)).sum() + (last * sn.tensor(w_h)).sum()

    loss().backward()
    tensors = [x, h0] + ([c0] if kind == "lstm" else []) + list(module.parameters())
    for t in tensors:
        want = central_differences(lambda: loss().item(), t.array)
        np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-6, atol=1e-8)


def test_unbatched_input_and_default_state(float64):
    lstm = nn.LSTM(3, 4, num_layers=2)
    x = RNG.standard_normal((5, 3))
    out, (h, c) = lstm(sn.tensor(x))
    batched, (hb, cb) = lstm(sn.tensor(x[:, None]))
    assert out.shape == (5, 4) and h.shape == (2, 4) and c.shape == (2, 4)
    np.testing.assert_array_equal(out.numpy(), batched.numpy()[:, 0])
    np.testing.assert_array_equal(h.numpy(), hb.numpy()[:, 0])


@pytest.mark.parametrize("kind", ["rnn_tanh", "lstm", "gru"])
def test_cells_equal_one_step_of_the_documented_equations(float64, kind):
    mode = {"rnn_tanh": "RNN_TANH", "lstm": "LSTM", "gru": "GRU"}[kind]
    cell = {"rnn_tanh": nn.RNNCell, "lstm": nn.LSTMCell, "gru": nn.GRUCell}[kind](3, 4)
    x, h, c = (RNG.standard_normal(s) for s in ((2, 3), (2, 4), (2, 4)))
    w = [cell.weight_ih.numpy(), cell.weight_hh.numpy(), cell.bias_ih.numpy(),
         cell.bias_hh.numpy()]
    want = np_cell(mode, x, (h, c) if mode == "LSTM" else h, *w)
    got = cell(sn.tensor(x), (sn.tensor(h), sn.tensor(c)) if mode == "LSTM" else sn.tensor(h))
    for g, e in zip(got if mode == "LSTM" else [got], want if mode == "LSTM" else [want]):
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-12, atol=1e-13)
    single = cell(sn.tensor(x[0]))  # unbatched, zero state
    first = single[0] if mode == "LSTM" else single
    assert first.shape == (4,)


def test_dropout_between_layers_only_in_training():
    gru = nn.GRU(3, 4, num_layers=2, dropout=0.5)
    x = sn.tensor(RNG.standard_normal((6, 2, 3)).astype(np.float32))
    gru.eval()
    a, b = gru(x)[0].numpy(), gru(x)[0].numpy()
    np.testing.assert_array_equal(a, b)
    gru.train()
    assert not np.allclose(gru(x)[0].numpy(), a)
    with pytest.warns(UserWarning, match="num_layers=1"):
        nn.LSTM(3, 4, dropout=0.2)


def test_errors_name_the_values():
    lstm = nn.LSTM(3, 4)
    with pytest.raises(RuntimeError, match="Expected 3, got 5"):
        lstm(sn.randn(2, 1, 5))
    with pytest.raises(RuntimeError, match=r"Expected hidden size \(1, 1, 4\)"):
        lstm(sn.randn(2, 1, 3), (sn.zeros(1, 2, 4), sn.zeros(1, 2, 4)))
    with pytest.raises(TypeError, match="tuple"):
        lstm(sn.randn(2, 1, 3), sn.zeros(1, 1, 4))
    with pytest.raises(NotImplementedError, match="proj_size=2"):
        nn.LSTM(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="Unknown nonlinearity 'sigmoid'"):
        nn.RNN(3, 4, nonlinearity="sigmoid")


def test_frozen_weights_get_no_gradient_and_the_input_still_does(float64):
    lstm = nn.LSTM(3, 4)
    lstm.weight_hh_l0.requires_grad_(False)
    x = sn.tensor(RNG.standard_normal((5, 2, 3)), requires_grad=True)
    lstm(x)[0].sum().backward()
    assert lstm.weight_hh_l0.grad is None and lstm.weight_ih_l0.grad is not None
    assert x.grad is not None and np.abs(x.grad.numpy()).sum() > 0
