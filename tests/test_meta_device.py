"""The meta device: shape-only tensors, as PyTorch's ``device("meta")``.

PyTorch's observed behaviour (2.13 CPU), which these tests assert for
spmdnet: building on meta draws nothing from the generator; ``to_empty``
then each submodule's ``reset_parameters()`` after ``manual_seed(s)`` gives
exactly the parameters of a direct construction after ``manual_seed(s)``;
in-place fills of a meta tensor are no-ops; copying data out raises
NotImplementedError; ``repr`` is ``tensor(..., device='meta', size=...)``.
Ops on meta tensors: tests/test_meta_ops.py.
"""
import tracemalloc

import numpy as np
import pytest

import spmdnet as sn
from spmdnet import nn


def _rng_unchanged(before):
    return np.array_equal(np.asarray(before), np.asarray(sn.get_rng_state()))


def _build():
    return nn.Sequential(nn.Linear(6, 5), nn.Embedding(7, 3), nn.LSTM(3, 4),
                         nn.Conv2d(2, 3, 3), nn.LayerNorm(4), nn.BatchNorm1d(4))


def _reset(model):
    for m in model.modules():
        if m is not model and hasattr(m, "reset_parameters"):
            m.reset_parameters()


@pytest.mark.parametrize("make", [
    lambda: nn.Linear(8, 4), lambda: nn.Conv2d(3, 5, 3), lambda: nn.Embedding(11, 4),
    lambda: nn.LSTM(4, 6, num_layers=2), lambda: nn.BatchNorm2d(3),
    lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0),
])
def test_meta_construction_draws_nothing_and_is_meta(make):
    sn.manual_seed(0)
    before = sn.get_rng_state()
    with sn.device("meta"):
        model = make()
    assert _rng_unchanged(before)
    tensors = list(model.parameters()) + list(model.buffers())
    assert tensors and all(t.is_meta and t.device == sn.device("meta") for t in tensors)
    assert all(p.requires_grad for p in model.parameters())


def test_creation_functions_on_meta_draw_nothing():
    sn.manual_seed(1)
    before = sn.get_rng_state()
    made = [sn.empty(3, 4, device="meta"), sn.randn(5, device="meta"),
            sn.rand(2, 2, device="meta"), sn.randint(0, 9, (4,), device="meta"),
            sn.randperm(6, device="meta"), sn.arange(1, 10, 2, device="meta"),
            sn.full((2, 3), 7.0, device="meta"), sn.tensor([1, 2], device="meta")]
    with sn.device("meta"):
        made += [sn.zeros(2, 3), sn.ones(4, dtype=sn.float64), sn.randn(3), sn.eye(3)]
    assert _rng_unchanged(before)
    assert [tuple(t.shape) for t in made] == [(3, 4), (5,), (2, 2), (4,), (6,), (5,), (2, 3),
                                              (2,), (2, 3), (4,), (3,), (3, 3)]
    assert all(t.is_meta for t in made)
    assert made[3].dtype == np.int64 and made[9].dtype == np.float64
    cpu = sn.zeros(2)
    assert not cpu.is_meta and cpu.device == sn.device("cpu")
    assert sn.zeros_like(made[0]).is_meta and sn.randn_like(made[0]).is_meta


def test_inplace_fills_and_init_on_meta_are_noops_drawing_nothing():
    t = sn.empty(4, 3, device="meta")
    before = sn.get_rng_state()
    for name in ("normal_", "uniform_", "bernoulli_", "exponential_", "cauchy_"):
        assert getattr(t, name)() is t
    t.fill_(2.0).zero_().copy_(sn.ones(4, 3))
    for init in (nn.init.kaiming_uniform_, nn.init.xavier_normal_, nn.init.orthogonal_,
                 nn.init.trunc_normal_, nn.init.ones_):
        assert init(t) is t
    assert _rng_unchanged(before) and t.is_meta


@pytest.mark.parametrize("where", ["with device", "device="])
def test_large_linear_on_meta_takes_no_memory(where):
    """Not even a transient ``np.empty`` of the data's size (the peak
    allocation during construction, NumPy's arrays included)."""
    tracemalloc.start()
    try:
        if where == "device=":
            big = nn.Linear(20000, 20000, device="meta")  # 1.6 GB as float32 with data
        else:
            with sn.device("meta"):
                big = nn.Linear(20000, 20000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert big.weight.shape == (20000, 20000) and big.weight.nbytes == 20000 * 20000 * 4
    assert peak < 1 << 20, f"{peak / 2**20:.1f} MiB allocated"


# PyTorch 2.13: a CPU tensor's add_/sub_/mul_/div_ (and +=, *=) by a meta
# tensor checks the shapes and leaves the CPU tensor as it was; clamp_ with a
# meta bound raises RuntimeError ("Tensor on device meta is not on the
# expected device cpu!"); copy_ and t[i] = meta raise NotImplementedError
# ("Cannot copy out of meta tensor; no data!")
KEEPS = {"add_": lambda r, v: r.add_(v), "sub_ alpha": lambda r, v: r.sub_(v, alpha=2),
         "mul_": lambda r, v: r.mul_(v), "div_": lambda r, v: r.div_(v),
         "+=": lambda r, v: r.__iadd__(v), "*= 0-d": lambda r, v: r.__imul__(v[0]),
         "float64 operand": lambda r, v: r.add_(v.double())}


@pytest.mark.parametrize("op", list(KEEPS), ids=list(KEEPS))
def test_cpu_tensor_updated_by_a_meta_one_is_left_as_pytorch_leaves_it(op):
    r = sn.tensor([1.0, 2.0, 3.0])
    assert KEEPS[op](r, sn.empty(3, device="meta")) is r
    np.testing.assert_array_equal(r.numpy(), [1.0, 2.0, 3.0])


@pytest.mark.parametrize("op, error, match", [
    (lambda r: r.add_(sn.empty(2, 3, device="meta")), RuntimeError,
     r"output with shape \[3\] doesn't match the broadcast shape"),
    (lambda r: r.sub_(sn.empty(4, device="meta")), RuntimeError, r"meta \(4,\)"),
    (lambda r: r.clamp_(min=sn.empty(3, device="meta")), RuntimeError,
     r"'meta' device .* 'cpu' device .*cpu \(3,\)"),
    (lambda r: r.copy_(sn.empty(3, device="meta")), NotImplementedError, "Cannot copy out"),
    (lambda r: r.__setitem__(0, sn.empty((), device="meta")), NotImplementedError,
     "Cannot copy out"),
    (lambda r: np.copyto(r.numpy(), sn.empty(3, device="meta").array), NotImplementedError,
     "copyto into a 'cpu' array"),
], ids=["add_ broadcast", "sub_ mismatch", "clamp_", "copy_", "setitem", "np.copyto"])
def test_cpu_tensor_written_from_a_meta_one_raises_and_keeps_its_data(op, error, match):
    r = sn.tensor([1.0, 2.0, 3.0])
    with pytest.raises(error, match=match):
        op(r)
    np.testing.assert_array_equal(r.numpy(), [1.0, 2.0, 3.0])


def test_int_tensor_updated_by_a_float_meta_one_refuses():
    """PyTorch: RuntimeError (int.add_(float) cannot promote in place)."""
    r = sn.tensor([1, 2, 3])
    with pytest.raises(RuntimeError, match="float.* can't be cast to .*int64"):
        r.add_(sn.empty(3, device="meta"))
    np.testing.assert_array_equal(r.numpy(), [1, 2, 3])


def test_to_empty_then_reset_equals_direct_construction_after_the_same_seed():
    sn.manual_seed(3)
    direct = [p.detach().numpy() for p in _build().parameters()]
    with sn.device("meta"):
        model = _build()
    params = list(model.parameters())
    sn.manual_seed(3)
    assert model.to_empty(device="cpu") is model
    assert list(model.parameters()) == params  # the same Parameter objects
    assert all(not t.is_meta and t.device == "cpu" for t in params + list(model.buffers()))
    _reset(model)
    for want, got in zip(direct, model.parameters(), strict=True):
        np.testing.assert_array_equal(got.detach().numpy(), want)
    out = model[0](sn.ones(2, 6))
    assert out.shape == (2, 5) and not out.is_meta


def test_load_state_dict_assign_onto_a_meta_model():
    sn.manual_seed(4)
    source = nn.Linear(3, 2)
    with sn.device("meta"):
        model = nn.Linear(3, 2)
    model.load_state_dict(source.state_dict(), assign=True)
    assert not model.weight.is_meta and model.weight.requires_grad
    assert isinstance(model.weight, nn.Parameter)
    x = sn.randn(4, 3)
    np.testing.assert_array_equal(model(x).detach().numpy(), source(x).detach().numpy())


@pytest.mark.parametrize("read", [lambda t: t.numpy(), lambda t: t.tolist(),
                                  lambda t: t.cpu(), lambda t: float(t[0])])
def test_reading_data_out_of_meta_refuses(read):
    t = sn.empty(3, device="meta")
    with pytest.raises(NotImplementedError, match="meta"):
        read(t)


def test_views_and_casts_stay_meta():
    t = sn.empty(2, 3, device="meta")
    assert all(v.is_meta for v in (t.T, t.reshape(3, 2), t[0], t.clone(), t.double()))
    assert t.double().dtype == np.float64


def test_repr_and_device_as_pytorch():
    assert repr(sn.empty(3, 4, device="meta")) == "tensor(..., device='meta', size=(3, 4))"
    assert repr(sn.empty(2, dtype=sn.int64, device="meta")) == \
        "tensor(..., device='meta', size=(2,), dtype=torch.int64)"
    assert repr(sn.empty((), dtype=sn.float64, device="meta")) == \
        "tensor(..., device='meta', size=(), dtype=torch.float64)"
    with sn.device("meta"):
        w = nn.Linear(3, 2).weight
    assert repr(w) == ("Parameter containing:\n"
                       "tensor(..., device='meta', size=(2, 3), requires_grad=True)")
    assert repr(w.device) == "device(type='meta')" and w.is_meta and not w.is_cpu


@pytest.mark.parametrize("make", [
    lambda: nn.Linear(3, 4, device="meta"), lambda: nn.Conv2d(2, 3, 3, device="meta"),
    lambda: nn.LSTM(3, 4, num_layers=2, device="meta"), lambda: nn.LSTMCell(3, 4, device="meta"),
    lambda: nn.Embedding(5, 2, device="meta"), lambda: nn.BatchNorm2d(3, device="meta"),
    lambda: nn.LayerNorm(4, device="meta"), lambda: nn.GroupNorm(2, 4, device="meta"),
    lambda: nn.MultiheadAttention(4, 2, device="meta")])
def test_device_meta_argument_builds_shape_only_and_draws_nothing(make):
    # PyTorch: a layer built with device="meta" has meta parameters and buffers and
    # consumes no random numbers (its init runs on meta tensors, which draw nothing)
    before = sn.get_rng_state().numpy().copy()
    module = make()
    np.testing.assert_array_equal(sn.get_rng_state().numpy(), before)
    tensors = list(module.parameters()) + list(module.buffers())
    assert tensors and all(t.is_meta for t in tensors)
