"""Modules with PyTorch's API: activation and shape modules against NumPy and
finite differences, traversal (apply order, children, modules), buffers
(persistent or not), dtype/device moves, requires_grad_, zero_grad, the
containers (indexing, slices, ModuleDict, ParameterList), Linear /
Embedding / LayerNorm arguments, and nn.utils."""
import math
from collections import OrderedDict

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn, optim
from spmdnet.autograd import gradcheck


def grad(t):
    """A parameter's gradient as a NumPy array (whatever ``.grad`` holds)."""
    return None if t.grad is None else np.asarray(t.grad)


def needs(*names):
    """Skip a row until the functions or Tensor methods it calls exist."""
    missing = [n for n in names
               if not hasattr(F, n.removeprefix("F.")) and not hasattr(sn.Tensor, n)]
    return pytest.mark.skipif(bool(missing), reason=f"waiting for {missing} (another "
                              "helper of issue 14 adds them)")


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def softplus(x, beta, threshold):
    return np.where(beta * x > threshold, x, np.log1p(np.exp(beta * x)) / beta)


# -- activation and shape modules: (module, NumPy oracle, input shape) ---------------------
ROWS = {
    "ReLU": (lambda: nn.ReLU(), lambda x: np.maximum(x, 0), (3, 4)),
    "Tanh": (lambda: nn.Tanh(), np.tanh, (3, 4)),
    "Sigmoid": (lambda: nn.Sigmoid(), sigmoid, (3, 4)),
    "Identity": (lambda: nn.Identity(3, unused=True), lambda x: x, (3, 4)),
    "SiLU": (lambda: nn.SiLU(), lambda x: x * sigmoid(x), (3, 4)),
    "LeakyReLU": (lambda: nn.LeakyReLU(), lambda x: np.where(x > 0, x, 0.01 * x), (3, 4)),
    "LeakyReLU(0.2)": (lambda: nn.LeakyReLU(0.2), lambda x: np.where(x > 0, x, 0.2 * x),
                       (3, 4)),
    "ELU": (lambda: nn.ELU(), lambda x: np.where(x > 0, x, np.expm1(x)), (3, 4)),
    "ELU(alpha=0.5)": (lambda: nn.ELU(alpha=0.5), lambda x: np.where(x > 0, x, 0.5 * np.expm1(x)),
                       (3, 4)),
    "Softplus": (lambda: nn.Softplus(), lambda x: softplus(x, 1.0, 20.0), (3, 4)),
    "Softplus(2, 3)": (lambda: nn.Softplus(beta=2.0, threshold=3.0),
                       lambda x: softplus(x, 2.0, 3.0), (3, 4)),
    "Softmax(0)": (lambda: nn.Softmax(dim=0), lambda x: softmax(x, 0), (3, 4)),
    "Softmax(-1)": (lambda: nn.Softmax(-1), lambda x: softmax(x, -1), (2, 3, 4)),
    "LogSoftmax(1)": (lambda: nn.LogSoftmax(dim=1), lambda x: np.log(softmax(x, 1)), (2, 3, 4)),
    "Flatten()": (lambda: nn.Flatten(), lambda x: x.reshape(2, -1), (2, 3, 4, 5)),
    "Flatten(0, 1)": (lambda: nn.Flatten(0, 1), lambda x: x.reshape(6, 4, 5), (2, 3, 4, 5)),
    "Flatten(1, -2)": (lambda: nn.Flatten(1, -2), lambda x: x.reshape(2, 12, 5), (2, 3, 4, 5)),
    "Unflatten(1, (2, 3))": (lambda: nn.Unflatten(1, (2, 3)), lambda x: x.reshape(4, 2, 3, 5),
                             (4, 6, 5)),
    "Unflatten(-1, (2, -1))": (lambda: nn.Unflatten(-1, (2, -1)),
                               lambda x: x.reshape(4, 6, 2, 2), (4, 6, 4)),
}
NEEDS = {"SiLU": ("F.silu",), "LeakyReLU": ("F.leaky_relu",), "LeakyReLU(0.2)": ("F.leaky_relu",),
         "ELU": ("F.elu",), "ELU(alpha=0.5)": ("F.elu",), "Softplus": ("F.softplus",),
         "Softplus(2, 3)": ("F.softplus",), "Flatten()": ("flatten",),
         "Flatten(0, 1)": ("flatten",), "Flatten(1, -2)": ("flatten",),
         "Unflatten(1, (2, 3))": ("unflatten",), "Unflatten(-1, (2, -1))": ("unflatten",)}
CASES = [pytest.param(name, marks=needs(*NEEDS.get(name, ())), id=name) for name in ROWS]


def sample(shape, seed=0):
    """Values away from the kinks at 0 and from Softplus's thresholds."""
    x = np.random.default_rng(seed).uniform(0.2, 2.0, size=shape)
    return x * np.where(np.arange(x.size).reshape(shape) % 2, 1.0, -1.0)


@pytest.mark.parametrize("name", CASES)
def test_activation_and_shape_modules_match_numpy(float64, name):
    make, oracle, shape = ROWS[name]
    xv = sample(shape)
    np.testing.assert_allclose(make()(sn.tensor(xv)).numpy(), oracle(xv), rtol=1e-12,
                               atol=1e-15)
    assert gradcheck(lambda x: make()(x), xv)


def test_softmax_without_dim_uses_pytorchs_legacy_rule_with_a_warning(float64):
    xv = sample((3, 4))
    with pytest.warns(UserWarning, match="dim=X"):
        out = nn.Softmax()(sn.tensor(xv))
    np.testing.assert_allclose(out.numpy(), softmax(xv, 1), rtol=1e-12)


def test_softplus_is_linear_above_the_threshold(float64):
    """Hand values: softplus(30) = 30 exactly (30 > 20); softplus(0) = log 2."""
    out = nn.Softplus()(sn.tensor(np.array([30.0, 0.0]))).numpy() if hasattr(F, "softplus") \
        else pytest.skip("waiting for F.softplus")
    assert out[0] == 30.0 and out[1] == pytest.approx(math.log(2), rel=1e-15)


# -- traversal ---------------------------------------------------------------------------
def tree():
    inner = nn.Sequential(nn.ReLU(), nn.Linear(3, 2))
    return nn.Sequential(nn.Linear(2, 3), inner), inner


def test_apply_visits_children_before_parents_and_returns_self():
    model, inner = tree()
    seen = []
    assert model.apply(seen.append) is model
    assert seen == [model[0], inner[0], inner[1], inner, model]  # PyTorch's post-order

    def init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.weight)
            nn.init.constant_(m.bias, 0.5)

    model.apply(init_weights)
    assert all((np.asarray(p.array) == v).all() for p, v in
               zip(model.parameters(), [0.0, 0.5, 0.0, 0.5]))


def test_modules_children_and_names():
    model, inner = tree()
    assert [n for n, _ in model.named_modules()] == ["", "0", "1", "1.0", "1.1"]
    assert list(model.modules())[0] is model and len(list(model.modules())) == 5
    assert [n for n, _ in model.named_children()] == ["0", "1"]
    assert list(model.children()) == [model[0], inner]
    assert [n for n, _ in model.named_modules(prefix="net")][:2] == ["net", "net.0"]
    shared = nn.Sequential(inner, inner)  # a module listed once, unless asked
    assert len(list(shared.children())) == 1 and len(list(shared.modules())) == 4
    assert len(list(shared.named_modules(remove_duplicate=False))) == 7
    assert [n for n, _ in model.named_parameters(recurse=False)] == []
    assert len(list(model[0].parameters(recurse=False))) == 2


def test_train_recurses_through_children_and_checks_the_mode():
    model, inner = tree()
    assert model.eval() is model and not inner[1].training
    assert model.train() is model and all(m.training for m in model.modules())
    with pytest.raises(ValueError, match="boolean"):
        model.train(1)


# -- buffers -----------------------------------------------------------------------------
class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("running", np.zeros(2, np.float32))
        self.register_buffer("mask", np.tril(np.ones((2, 2), np.float32)), persistent=False)
        self.register_buffer("steps", np.array(0, np.int64))
        self.register_buffer("nothing", None)


def test_buffers_persistent_and_not():
    m = WithBuffers()
    assert [n for n, _ in m.named_buffers()] == ["running", "mask", "steps"]
    assert len(list(m.buffers())) == 3 and isinstance(m.mask, sn.Tensor)
    assert list(m.state_dict()) == ["running", "steps", "lin.weight", "lin.bias"]
    sd = m.state_dict()
    sd["running"] = np.ones(2, np.float32)
    assert m.load_state_dict(sd) == ([], [])  # strict: the mask is not expected
    np.testing.assert_array_equal(m.running.numpy(), [1.0, 1.0])
    m.mask = np.zeros((2, 2), np.float32)  # re-assigning keeps it a non-persistent buffer
    assert "mask" not in m.state_dict() and isinstance(m.mask, sn.Tensor)
    m.register_buffer("mask", m.mask.data, persistent=True)
    assert "mask" in m.state_dict()
    del m.running
    assert [n for n, _ in m.named_buffers()] == ["mask", "steps"]


@pytest.mark.parametrize("name, error", [("lin", KeyError), ("a.b", KeyError), ("", KeyError),
                                         (3, TypeError)])
def test_register_buffer_rejects_bad_names(name, error):
    with pytest.raises(error):
        WithBuffers().register_buffer(name, np.zeros(1))


def test_register_parameter_and_add_module():
    m = nn.Module()
    m.register_parameter("w", nn.Parameter(np.ones(2)))
    m.add_module("child", nn.Linear(1, 1))
    m.register_parameter("none", None)
    assert [n for n, _ in m.named_parameters()] == ["w", "child.weight", "child.bias"]
    with pytest.raises(TypeError):
        m.register_parameter("x", sn.tensor(np.ones(2)))
    with pytest.raises(TypeError):
        m.add_module("y", 3)


# -- dtypes, devices, requires_grad, zero_grad ---------------------------------------------
@pytest.mark.parametrize("cast, dtype", [
    (lambda m: m.double(), np.float64), (lambda m: m.float(), np.float32),
    (lambda m: m.half(), np.float16), (lambda m: m.to(np.float64), np.float64),
    (lambda m: m.to(dtype=np.float64), np.float64), (lambda m: m.to("cpu", np.float64), np.float64),
    (lambda m: m.to(sn.tensor(np.zeros(1))), np.float64)])
def test_to_dtype_casts_floating_parameters_and_buffers(cast, dtype):
    m = WithBuffers()
    if dtype == np.float32:
        m.double()
    assert cast(m) is m
    assert all(p.dtype == dtype for p in m.parameters())
    assert m.running.dtype == dtype and m.mask.dtype == dtype
    assert m.steps.dtype == np.int64  # integers stay as they are (as PyTorch)
    out = m.lin(sn.tensor(np.ones((1, 2), dtype)))
    assert out.dtype == dtype


def test_to_rejects_an_integer_dtype_and_unknown_keywords():
    with pytest.raises(TypeError, match="floating point"):
        nn.Linear(2, 2).to(np.int64)
    with pytest.raises(TypeError):
        nn.Linear(2, 2).to(memory_format=None)


def test_double_lets_a_float32_model_check_gradients():
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    assert gradcheck(lambda x: model(x), np.random.default_rng(0).standard_normal((5, 3)))


def test_requires_grad_freezes_and_unfreezes():
    model, inner = tree()
    assert model[0].requires_grad_(False) is model[0]
    model(sn.tensor(np.ones((2, 2), np.float32))).sum().backward()
    assert model[0].weight.grad is None and grad(inner[1].weight) is not None
    model.requires_grad_()
    assert all(p.requires_grad for p in model.parameters())


def test_zero_grad_set_to_none_default_and_in_place():
    model, _ = tree()
    x = sn.tensor(np.ones((2, 2), np.float32))
    model(x).sum().backward()
    arrays = [grad(p) for p in model.parameters()]
    values = [a.copy() for a in arrays]
    model.zero_grad(set_to_none=False)
    for p, a in zip(model.parameters(), arrays):
        assert np.shares_memory(grad(p), a) and not grad(p).any()  # zeroed in place
    model(x).sum().backward()  # accumulates into the same arrays
    for p, a, v in zip(model.parameters(), arrays, values):
        assert np.shares_memory(grad(p), a) and np.array_equal(grad(p), v)
    np.testing.assert_array_equal(grad(model[1][1].bias), [2.0, 2.0])  # batch of 2
    model.zero_grad()  # PyTorch's default since 2.0
    assert all(p.grad is None for p in model.parameters())


# -- containers ----------------------------------------------------------------------------
def test_sequential_indexing_slices_and_len():
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 4), nn.Tanh())
    assert len(seq) == 4 and seq[-1] is seq[3] and seq[-4] is seq[0]
    for bad in (4, -5):
        with pytest.raises(IndexError):
            seq[bad]
    tail = seq[2:]
    assert isinstance(tail, nn.Sequential) and len(tail) == 2 and tail[0] is seq[2]
    assert list(tail.state_dict()) == ["2.weight", "2.bias"]  # PyTorch keeps the names
    assert tail.fused_pairs() == [(0, "tanh")] and seq[:2].fused_pairs() == [(0, "relu")]
    x = sn.tensor(np.ones((5, 2), np.float32))
    np.testing.assert_allclose(seq(x).numpy(), seq[2:](seq[:2](x)).numpy(), rtol=1e-6)
    assert [type(m) for m in seq[::2]] == [nn.Linear, nn.Linear]


def test_sequential_from_an_ordered_dict_and_item_assignment():
    seq = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 3)), ("act", nn.ReLU())]))
    assert [n for n, _ in seq.named_children()] == ["fc", "act"] and seq[0] is seq.fc
    assert seq.fused_pairs() == [(0, "relu")]
    seq[1] = nn.Tanh()
    assert isinstance(seq.act, nn.Tanh)
    del seq[0]
    assert [n for n, _ in seq.named_children()] == ["0"]  # PyTorch renumbers after del


def test_module_list_indexing_slices_insert_and_extend():
    layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert len(layers) == 3 and layers[-1] is layers[2]
    part = layers[1:]
    assert isinstance(part, nn.ModuleList) and [n for n, _ in part.named_children()] == ["0", "1"]
    layers.insert(0, nn.ReLU())
    layers.extend([nn.Tanh()])
    layers += [nn.Sigmoid()]
    assert [type(m) for m in layers] == [nn.ReLU, nn.Linear, nn.Linear, nn.Linear, nn.Tanh,
                                         nn.Sigmoid]
    assert [n for n, _ in layers.named_parameters()][:2] == ["1.weight", "1.bias"]
    del layers[0]
    assert isinstance(layers[0], nn.Linear) and list(layers.state_dict())[0] == "0.weight"


def test_module_dict():
    d = nn.ModuleDict({"enc": nn.Linear(2, 3), "act": nn.ReLU()})
    d["dec"] = nn.Linear(3, 2)
    assert list(d) == ["enc", "act", "dec"] and len(d) == 3 and "act" in d
    assert list(d.keys()) == ["enc", "act", "dec"] and d["enc"] is d.enc
    assert [k for k, _ in d.items()] == list(d) and len(list(d.values())) == 3
    assert list(d.state_dict()) == ["enc.weight", "enc.bias", "dec.weight", "dec.bias"]
    assert isinstance(d.pop("act"), nn.ReLU) and "act" not in d
    d.update([("act", nn.Tanh())])
    assert list(d) == ["enc", "dec", "act"]
    with pytest.raises(TypeError):
        d["bad"] = 3
    d.clear()
    assert len(d) == 0


def test_parameter_list():
    plist = nn.ParameterList([nn.Parameter(np.ones(2)), np.zeros(3)])
    plist.append(sn.tensor(np.ones(4)))
    assert len(plist) == 3 and all(isinstance(p, nn.Parameter) for p in plist)
    assert plist[-1].shape == (4,) and plist[1].requires_grad
    assert [n for n, _ in plist.named_parameters()] == ["0", "1", "2"]
    assert [p.shape for p in plist[1:]] == [(3,), (4,)]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.scales = nn.ParameterList([np.ones(2, np.float32) for _ in range(2)])

    assert list(Net().state_dict()) == ["scales.0", "scales.1"]
    assert len(optim.SGD(Net().parameters(), lr=0.1).param_groups[0]["params"]) == 2


# -- layers with PyTorch's arguments -----------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda dt: nn.Linear(3, 2, dtype=dt), lambda dt: nn.Linear(3, 2, bias=False, dtype=dt),
    lambda dt: nn.Embedding(4, 3, dtype=dt), lambda dt: nn.LayerNorm(3, dtype=dt),
    lambda dt: nn.LayerNorm((2, 3), bias=False, device="cpu", dtype=dt)])
def test_layers_take_dtype_and_device(make):
    for dt in (np.float64, np.float32):
        assert all(p.dtype == dt for p in make(dt).parameters())


@pytest.mark.parametrize("padding_idx, row", [(None, None), (-1, 4), (2, 2)])
def test_embedding_lookup_and_gradient_with_padding_idx(float64, padding_idx, row):
    """Repeated indices add up; the padding row starts at zero and gets no gradient."""
    sn.manual_seed(0)
    emb = nn.Embedding(5, 3, padding_idx=padding_idx)
    assert emb.padding_idx == row
    if row is not None:
        np.testing.assert_array_equal(emb.weight.numpy()[row], 0.0)
        emb.weight.data[row] = 7.0  # the output keeps whatever the row holds (as PyTorch)
    idx = np.array([[0, 4, 4], [2, 4, 0]])
    out = emb(sn.tensor(idx))
    np.testing.assert_array_equal(out.numpy(), emb.weight.numpy()[idx])
    gv = np.random.default_rng(0).standard_normal((2, 3, 3))
    out.backward(gv)
    expected = np.zeros((5, 3))
    np.add.at(expected, idx.reshape(-1), gv.reshape(-1, 3))
    np.testing.assert_allclose(expected[4], gv[0, 1] + gv[0, 2] + gv[1, 1])
    if row is not None:
        expected[row] = 0.0
    np.testing.assert_allclose(grad(emb.weight), expected, rtol=1e-14)
    assert emb(idx).shape == (2, 3, 3)  # plain array indices


def test_embedding_arguments():
    with pytest.raises(ValueError, match="padding_idx"):
        nn.Embedding(5, 3, padding_idx=5)
    with pytest.raises(NotImplementedError):
        nn.Embedding(3, 2, max_norm=1.0)
    w = np.arange(6.0).reshape(3, 2)
    emb = nn.Embedding(3, 2, _weight=w)
    np.testing.assert_array_equal(emb(sn.tensor(np.array([2]))).numpy(), [[4.0, 5.0]])
    assert not nn.Embedding(3, 2, _weight=w, _freeze=True).weight.requires_grad


@pytest.mark.parametrize("shape, kwargs, names", [
    (4, {}, ["weight", "bias"]), ((3, 4), {}, ["weight", "bias"]),
    ([4], {"bias": False}, ["weight"]), ((3, 4), {"elementwise_affine": False}, [])])
def test_layer_norm_arguments_match_numpy_and_finite_differences(float64, shape, kwargs, names):
    ln = nn.LayerNorm(shape, eps=1e-3, **kwargs)
    assert [n for n, _ in ln.named_parameters()] == names
    norm = ln.normalized_shape
    rng = np.random.default_rng(0)
    for p in ln.parameters():
        p.data[...] = rng.standard_normal(norm)
    xv = rng.standard_normal((2,) + norm) * 3 + 1
    axes = tuple(range(-len(norm), 0))
    mu, var = xv.mean(axis=axes, keepdims=True), xv.var(axis=axes, keepdims=True)
    expected = (xv - mu) / np.sqrt(var + 1e-3)
    if ln.weight is not None:
        expected = expected * ln.weight.numpy()
    if ln.bias is not None:
        expected = expected + ln.bias.numpy()
    np.testing.assert_allclose(ln(sn.tensor(xv)).numpy(), expected, rtol=1e-12, atol=1e-13)
    assert gradcheck(lambda x: ln(x), xv)
    named = [n for n, _ in ln.named_parameters()]

    def through_params(*tensors):  # the output as a function of weight (and bias)
        ln._parameters.update(zip(named, tensors))
        return ln(sn.tensor(xv))

    if named:
        assert gradcheck(through_params, *[p.numpy() for p in ln.parameters()])
    with pytest.raises(RuntimeError, match="normalized_shape"):
        ln(sn.tensor(np.ones((2, 5))))


# -- nn.utils --------------------------------------------------------------------------
def with_grads(seed=0):
    rng = np.random.default_rng(seed)
    params = [nn.Parameter(np.zeros(s)) for s in [(3, 4), (4,), (2, 2)]]
    for p in params:
        p.grad = rng.standard_normal(p.shape)
    return params


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, 0.5, math.inf, "inf"])
def test_clip_grad_norm_matches_numpy(norm_type):
    params = with_grads()
    flat = np.concatenate([grad(p).ravel() for p in params])
    order = float(norm_type)
    expected = np.abs(flat).max() if order == math.inf else \
        (np.abs(flat) ** order).sum() ** (1 / order)
    views = [grad(p) for p in params]
    total = nn.utils.clip_grad_norm_(params, max_norm=0.1, norm_type=norm_type)
    assert total.item() == pytest.approx(expected, rel=1e-12) and float(total) == total
    for p, v in zip(params, views):
        assert np.shares_memory(grad(p), v)  # scaled in place (bucket views stay valid)
    after = np.concatenate([grad(p).ravel() for p in params])
    np.testing.assert_allclose(after, flat * 0.1 / (expected + 1e-6), rtol=1e-12)


def test_clip_grad_norm_names_and_non_finite_totals():
    assert nn.utils.clip_grad_norm_ is optim.clip_grad_norm_
    params = with_grads()
    grad(params[0])[0, 0] = np.inf
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    with np.errstate(invalid="ignore"):  # as PyTorch: scaled by 1/inf = 0 (inf * 0: NaN)
        total = nn.utils.clip_grad_norm_(params, 1.0)
    assert total == math.inf and grad(params[1]).any() == 0 and np.isnan(grad(params[0])[0, 0])
    p = nn.Parameter(np.zeros(2))
    p.grad = np.array([3.0, 4.0])  # under the max: untouched
    assert nn.utils.clip_grad_norm_(p, 10.0) == 5.0 and list(grad(p)) == [3.0, 4.0]


def test_clip_grad_value_():
    params = with_grads()
    before = [grad(p).copy() for p in params]
    views = [grad(p) for p in params]
    assert nn.utils.clip_grad_value_(params, clip_value=0.5) is None
    for p, b, v in zip(params, before, views):
        np.testing.assert_array_equal(grad(p), np.clip(b, -0.5, 0.5))
        assert np.shares_memory(grad(p), v)


def test_parameters_to_vector_and_back(float64):
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    vec = nn.utils.parameters_to_vector(model.parameters())
    expected = np.concatenate([p.numpy().ravel() for p in model.parameters()])
    np.testing.assert_array_equal(vec.numpy(), expected)
    w = np.arange(vec.shape[0], dtype=np.float64)
    (vec * sn.tensor(w)).sum().backward()  # differentiable, as PyTorch's torch.cat
    np.testing.assert_array_equal(np.concatenate([grad(p).ravel() for p in model.parameters()]), w)
    arrays = [p.array for p in model.parameters()]
    nn.utils.vector_to_parameters(sn.tensor(-w), model.parameters())
    np.testing.assert_array_equal(nn.utils.parameters_to_vector(model.parameters()).numpy(), -w)
    assert all(p.array is a for p, a in zip(model.parameters(), arrays))  # in place
    with pytest.raises(ValueError, match="elements"):
        nn.utils.vector_to_parameters(sn.tensor(w[:-1]), model.parameters())
    with pytest.raises(TypeError):
        nn.utils.vector_to_parameters(w, model.parameters())


# -- on the GPU --------------------------------------------------------------------------
@pytest.mark.gpu
def test_modules_init_and_utils_on_cupy(float64):
    """The same seed gives the same weights on the GPU; init fills CuPy arrays in
    place; buffers move; clipping and the vector conversions work on CuPy."""
    sn.manual_seed(0)
    host = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4, device="cuda"), nn.Tanh(), nn.Linear(4, 2)).cuda()
    model.register_buffer("mask", np.ones(2), persistent=False)
    model.to("gpu")
    assert all(p.device == "gpu" for p in model.parameters()) and model.mask.device == "gpu"
    for p, q in zip(model.parameters(), host.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    array = model[0].weight.array
    nn.init.trunc_normal_(model[0].weight, std=0.5)
    nn.init.kaiming_normal_(model[2].weight)
    assert model[0].weight.array is array and np.abs(model[0].weight.numpy()).max() <= 2.0
    x = sn.tensor(np.ones((5, 3))).to("gpu")
    model(x).sum().backward()
    flat = np.concatenate([_host(p.grad).ravel() for p in model.parameters()])
    total = nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    assert total.item() == pytest.approx(np.linalg.norm(flat), rel=1e-12)
    nn.utils.clip_grad_value_(model.parameters(), 1e-3)
    assert all(np.abs(_host(p.grad)).max() <= 1e-3 for p in model.parameters())
    vec = nn.utils.parameters_to_vector(model.parameters())
    assert vec.device == "gpu"
    nn.utils.vector_to_parameters(vec * 2.0, model.parameters())
    np.testing.assert_allclose(nn.utils.parameters_to_vector(model.parameters()).numpy(),
                               2.0 * vec.numpy())
    emb = nn.Embedding(4, 2, padding_idx=1, device="gpu")
    emb(sn.tensor(np.array([1, 1, 2])).to("gpu")).sum().backward()
    np.testing.assert_array_equal(_host(emb.weight.grad)[1], 0.0)
    assert model.float()[0].weight.dtype == np.float32 and model[0].weight.device == "gpu"


def _host(g):
    """A gradient (CuPy array or Tensor) as a host NumPy array."""
    return sn.tensor(g).numpy() if not isinstance(g, sn.Tensor) else g.numpy()
