"""Modules: PyTorch's parameter names and state_dict keys (written out by
hand), initialisation, layers against NumPy, modes, state round trips."""
import numpy as np
import pytest

import spmdnet as sn
from spmdnet import nn


@pytest.fixture
def f64():
    """float64 default dtype for this test; float32 restored afterwards."""
    sn.set_default_dtype(np.float64)
    yield
    sn.set_default_dtype(np.float32)


class Net(nn.Module):
    """A custom module with a parameter of its own assigned after submodules."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8))
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 3, bias=False)
        self.scale = nn.Parameter(np.ones(3, dtype=np.float32))

    def forward(self, x):
        return self.head(self.norm(self.encoder(x))) * self.scale


NET_KEYS = ["scale",  # PyTorch lists a module's own parameters before its children's
            "encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias",
            "norm.weight", "norm.bias", "head.weight"]


def mlp(seed):
    sn.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


# -- names and keys --------------------------------------------------------------------
def test_sequential_names_and_keys_match_pytorch():
    model = mlp(0)
    expected = ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert [n for n, _ in model.named_parameters()] == expected
    assert list(model.state_dict()) == expected
    assert [p.shape for p in model.parameters()] == [(4, 3), (4,), (2, 4), (2,)]


def test_nested_sequential_names():
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 3), nn.ReLU()), nn.Linear(3, 1))
    expected = ["0.0.weight", "0.0.bias", "1.weight", "1.bias"]
    assert [n for n, _ in model.named_parameters()] == expected
    assert list(model.state_dict()) == expected


def test_custom_module_names_and_keys_match_pytorch():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == NET_KEYS
    assert list(net.state_dict()) == NET_KEYS
    assert [n for n, _ in net.named_modules()] == [
        "", "encoder", "encoder.0", "encoder.1", "encoder.2", "norm", "head"]
    x = sn.tensor(np.ones((2, 4), dtype=np.float32))
    assert net(x).shape == (2, 3)


def test_registration_order_is_attribute_order():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.zeta = nn.Parameter(np.zeros(1))
            self.alpha = nn.Parameter(np.zeros(2))
            self.mid = nn.Linear(1, 1)
            self.beta = nn.Parameter(np.zeros(3))

    assert [n for n, _ in M().named_parameters()] == [
        "zeta", "alpha", "beta", "mid.weight", "mid.bias"]


def test_reassigning_keeps_position_as_in_pytorch():
    model = mlp(0)
    model[0].weight = nn.Parameter(np.zeros((4, 3), dtype=np.float32))
    setattr(model, "0", nn.Linear(3, 4))  # replace a submodule
    assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_assigning_a_plain_tensor_over_a_parameter_raises():
    lin = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="weight"):
        lin.weight = sn.tensor(np.zeros((2, 2), dtype=np.float32))
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
    lin.bias = None  # None is allowed and unregisters the value
    assert [n for n, _ in lin.named_parameters()] == ["weight"]
    assert lin.bias is None


def test_shared_parameter_listed_once_but_saved_under_both_names():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5, 3)
            self.head = nn.Linear(3, 5)
            self.head.weight = self.emb.weight

    m = Tied()
    assert [n for n, _ in m.named_parameters()] == ["emb.weight", "head.bias"]
    assert len(list(m.parameters())) == 2
    # PyTorch's state_dict keeps every name of a tied tensor
    sd = m.state_dict()
    assert list(sd) == ["emb.weight", "head.weight", "head.bias"]
    np.testing.assert_array_equal(sd["emb.weight"], sd["head.weight"])
    m.load_state_dict(sd)  # strict: both names expected


def test_shared_submodule_parameters_listed_once():
    lin = nn.Linear(2, 2)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias"]


# -- initialisation ----------------------------------------------------------------------
def test_linear_init_shape_bound_and_uniformity():
    sn.manual_seed(0)
    lin = nn.Linear(400, 500)
    bound = 1.0 / np.sqrt(400)
    w = lin.weight.numpy()
    assert w.shape == (500, 400) and lin.bias.shape == (500,)
    assert w.dtype == np.float32 and lin.bias.dtype == np.float32
    assert np.abs(w).max() <= bound and np.abs(lin.bias.numpy()).max() <= bound
    assert w.min() < -0.999 * bound and w.max() > 0.999 * bound
    counts, _ = np.histogram(w, bins=10, range=(-bound, bound))
    np.testing.assert_allclose(counts / w.size, 0.1, atol=0.003)  # flat histogram
    assert abs(w.mean()) < 0.005 * bound
    np.testing.assert_allclose(w.std(), bound / np.sqrt(3), rtol=0.01)


def test_same_seed_same_weights_different_seed_different():
    a, b, c = mlp(3), mlp(3), mlp(4)
    for (n, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(),
                                         c.named_parameters()):
        np.testing.assert_array_equal(pa.numpy(), pb.numpy(), err_msg=n)
        assert not np.array_equal(pa.numpy(), pc.numpy()), n


def test_numpy_global_rng_untouched():
    np.random.seed(1234)
    state = np.random.get_state()
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 5), nn.Dropout(0.5), nn.Embedding(4, 5))
    model[0](sn.tensor(np.ones((3, 5), dtype=np.float32)))
    model[1](sn.tensor(np.ones((3, 5), dtype=np.float32)))
    after = np.random.get_state()
    assert state[0] == after[0] and state[2:] == after[2:]
    np.testing.assert_array_equal(state[1], after[1])


def test_layer_norm_and_embedding_init():
    ln = nn.LayerNorm(6)
    np.testing.assert_array_equal(ln.weight.numpy(), np.ones(6))
    np.testing.assert_array_equal(ln.bias.numpy(), np.zeros(6))
    sn.manual_seed(0)
    emb = nn.Embedding(300, 100)
    w = emb.weight.numpy()
    assert w.shape == (300, 100)
    assert abs(w.mean()) < 0.02 and abs(w.std() - 1.0) < 0.02  # N(0, 1)


# -- layers against NumPy -------------------------------------------------------------
def test_linear_forward_and_backward_match_numpy(f64):
    sn.manual_seed(0)
    lin = nn.Linear(3, 4)
    W, b = lin.weight.numpy(), lin.bias.numpy()
    assert W.dtype == np.float64
    xv = np.random.default_rng(0).standard_normal((2, 5, 3))
    x = sn.tensor(xv, requires_grad=True)
    y = lin(x)
    np.testing.assert_allclose(y.numpy(), xv @ W.T + b, rtol=1e-13)
    gv = np.random.default_rng(1).standard_normal((2, 5, 4))
    y.backward(gv)
    np.testing.assert_allclose(x.grad, gv @ W, rtol=1e-12)
    np.testing.assert_allclose(lin.weight.grad, np.einsum("bno,bni->oi", gv, xv), rtol=1e-12)
    np.testing.assert_allclose(lin.bias.grad, gv.sum(axis=(0, 1)), rtol=1e-12)


def test_linear_without_bias(f64):
    lin = nn.Linear(3, 2, bias=False)
    assert lin.bias is None and [n for n, _ in lin.named_parameters()] == ["weight"]
    xv = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(lin(sn.tensor(xv)).numpy(), xv @ lin.weight.numpy().T)


def test_layer_norm_module_matches_numpy(f64):
    ln = nn.LayerNorm(4, eps=1e-5)
    ln.weight.data[...] = [1.0, 2.0, -1.0, 0.5]
    ln.bias.data[...] = [0.0, 0.1, 0.2, 0.3]
    xv = np.random.default_rng(0).standard_normal((3, 4)) * 5 + 2
    mu = xv.mean(axis=-1, keepdims=True)
    var = ((xv - mu) ** 2).mean(axis=-1, keepdims=True)
    expected = (xv - mu) / np.sqrt(var + 1e-5) * ln.weight.numpy() + ln.bias.numpy()
    np.testing.assert_allclose(ln(sn.tensor(xv)).numpy(), expected, rtol=1e-12)


def test_dropout_eval_is_identity_train_drops_fraction_p():
    p = 0.3
    drop = nn.Dropout(p)
    xv = np.random.default_rng(0).uniform(1.0, 2.0, size=(200, 500)).astype(np.float32)
    x = sn.tensor(xv, requires_grad=True)
    drop.eval()
    np.testing.assert_array_equal(drop(x).numpy(), xv)
    drop.train()
    sn.manual_seed(0)
    y = drop(x)
    out = y.numpy()
    zero = out == 0
    assert abs(zero.mean() - p) < 0.01
    np.testing.assert_allclose(out[~zero], xv[~zero] / (1 - p), rtol=1e-6)
    y.sum().backward()  # gradient: the same mask and scale
    np.testing.assert_allclose(x.grad, np.where(zero, 0.0, 1.0 / (1 - p)), rtol=1e-6)
    sn.manual_seed(0)
    np.testing.assert_array_equal(drop(x).numpy(), out)  # the seed fixes the mask


def test_dropout_p_zero_and_one():
    x = sn.tensor(np.ones((4, 4), dtype=np.float32), requires_grad=True)
    np.testing.assert_array_equal(nn.Dropout(0.0)(x).numpy(), np.ones((4, 4)))
    y = nn.Dropout(1.0)(x)
    np.testing.assert_array_equal(y.numpy(), np.zeros((4, 4)))
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, np.zeros((4, 4)))
    with pytest.raises(ValueError, match="1.5"):
        nn.Dropout(1.5)


# -- modes, state ----------------------------------------------------------------------
def test_train_eval_propagate_to_children():
    net = nn.Sequential(Net(), nn.Dropout(0.1))
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    assert not net[0].encoder[1].training
    net.train()
    assert all(m.training for m in net.modules())
    net[0].train(False)
    assert net.training and not net[0].encoder.training


def test_load_state_dict_round_trip():
    x = sn.tensor(np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32))
    a, b = mlp(0), mlp(1)
    assert not np.allclose(a(x).numpy(), b(x).numpy())
    buffers = [p.array for p in b.parameters()]
    assert b.load_state_dict(a.state_dict()) == ([], [])
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    assert all(p.array is buf for p, buf in zip(b.parameters(), buffers))  # in place


def test_load_state_dict_strict_names_missing_and_unexpected():
    model = mlp(0)
    sd = model.state_dict()
    del sd["0.bias"]
    sd["3.weight"] = np.zeros((2, 2), dtype=np.float32)
    with pytest.raises(RuntimeError) as err:  # PyTorch's "Error(s) in loading state_dict"
        model.load_state_dict(sd)
    assert "0.bias" in str(err.value) and "3.weight" in str(err.value)


def test_load_state_dict_shape_mismatch_names_parameter_and_shapes():
    model = mlp(0)
    sd = model.state_dict()
    sd["2.weight"] = np.zeros((3, 4), dtype=np.float32)
    for strict in (True, False):
        with pytest.raises(RuntimeError) as err:  # a size mismatch, even when not strict
            model.load_state_dict(sd, strict=strict)
        msg = str(err.value)
        assert "2.weight" in msg and "(3, 4)" in msg and "(2, 4)" in msg


def test_load_state_dict_non_strict_returns_missing_and_unexpected():
    model = mlp(0)
    sd = mlp(1).state_dict()
    del sd["2.bias"]
    sd["extra"] = np.zeros(1)
    old_bias = model[2].bias.numpy().copy()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert missing == ["2.bias"] and unexpected == ["extra"]
    np.testing.assert_array_equal(model[0].weight.numpy(), sd["0.weight"])
    np.testing.assert_array_equal(model[2].bias.numpy(), old_bias)


# -- containers ------------------------------------------------------------------------
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU("tanh"),
               "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
def test_sequential_fused_and_unfused_paths_agree(f64, name, bias):
    """Linear + activation runs as one fused op by default; fuse=False calls
    each module: the same outputs and gradients either way."""
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6, bias=bias), ACTIVATIONS[name](), nn.Linear(6, 3),
                          nn.Identity(), nn.Linear(3, 4), ACTIVATIONS[name]())
    assert model.fused_pairs() == [(0, name), (4, name)]
    xv = np.random.default_rng(1).standard_normal((7, 5))
    gv = np.random.default_rng(2).standard_normal((7, 4))
    results = []
    for fuse in (True, False):
        model.fuse = fuse
        model.zero_grad()
        x = sn.tensor(xv, requires_grad=True)
        y = model(x)
        assert (type(y._ctx).__name__ == "LinearAct") == fuse
        y.backward(gv)
        grads = [x.grad] + [p.grad for p in model.parameters()]
        results.append([y.numpy()] + [np.array(g) for g in grads])
    assert model.fused_pairs() == [] and "fuse=False" in repr(model)
    for fused, plain in zip(*results):
        np.testing.assert_allclose(fused, plain, rtol=1e-12, atol=1e-14)


def test_sequential_fuses_only_a_plain_linear_before_an_activation():
    class MyLinear(nn.Linear):
        pass

    model = nn.Sequential(nn.ReLU(), nn.Linear(2, 2), nn.Linear(2, 2), nn.Tanh(),
                          MyLinear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    assert model.fused_pairs() == [(2, "tanh")]
    assert nn.Sequential(nn.Linear(2, 2), nn.ReLU(), fuse=False).fused_pairs() == []


def test_module_list_and_sequential_share_one_base():
    layers = nn.ModuleList([nn.Linear(2, 3)]).append(nn.ReLU())
    assert isinstance(layers, nn.ModuleSequence) and isinstance(nn.Sequential(), nn.ModuleSequence)
    assert len(layers) == 2 and isinstance(layers[-1], nn.ReLU)
    assert [type(m) for m in layers] == [nn.Linear, nn.ReLU]
    assert [n for n, _ in layers.named_parameters()] == ["0.weight", "0.bias"]
    seq = nn.Sequential(nn.Linear(2, 3)).append(nn.ReLU())
    assert seq.fused_pairs() == [(0, "relu")]
