"""``state_dict`` and ``load_state_dict`` as PyTorch's (issue 23 item 2):
detached Tensors sharing the parameters' memory (nanoGPT's and minGPT's
``from_pretrained`` load with ``sd[k].copy_(v)``), ``keep_vars``, PyTorch's
error text listing every problem (recorded from PyTorch 2), the named-tuple
result, ``assign=True``; and the checkpoint's saved state, which must not
change when training goes on."""
from collections import OrderedDict

import numpy as np
import pytest

import spmdnet as sn
from spmdnet import nn
from spmdnet.checkpoint import state as checkpoint_state


def model(seed=0):
    sn.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))


KEYS = ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
        "1.num_batches_tracked"]


def test_values_are_detached_tensors_sharing_memory():
    m = model()
    sd = m.state_dict()
    assert isinstance(sd, OrderedDict) and list(sd) == KEYS
    owners = dict(m.named_parameters()) | dict(m.named_buffers())
    for key, value in sd.items():
        assert type(value) is sn.Tensor and not value.requires_grad, key
        assert value.grad_fn is None and value.is_leaf, key
        assert np.shares_memory(value.array, owners[key].array), key
    sd["0.weight"][0, 0] = 42.0  # writes the model, as PyTorch's
    assert m[0].weight[0, 0].item() == 42.0
    m[0].bias.data.fill_(-1.0)  # and the model's changes show in the state
    assert sd["0.bias"].tolist() == [-1.0] * 3


def test_keep_vars_gives_the_parameters_and_prefix_prefixes():
    m = model()
    sd = m.state_dict(keep_vars=True)
    assert sd["0.weight"] is m[0].weight and sd["1.running_mean"] is m[1].running_mean
    assert list(m.state_dict(prefix="net.")) == ["net." + k for k in KEYS]
    into = OrderedDict(extra=1)
    assert m.state_dict(destination=into) is into and list(into) == ["extra"] + KEYS


def test_from_pretrained_copy_into_state_dict_loads_the_model():
    # nanoGPT's from_pretrained: sd = model.state_dict(); sd[k].copy_(sd_hf[k]) under no_grad
    m, source = model(0), model(1)
    sd, sd_hf = m.state_dict(), source.state_dict()
    with sn.no_grad():
        for k in sd_hf:
            if k == "0.weight":
                sd[k].copy_(sd_hf[k].t().t())  # the transposed-Conv1D path: a view in
            else:
                sd[k].copy_(sd_hf[k])
    x = sn.tensor(np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32))
    m.eval(), source.eval()
    np.testing.assert_array_equal(m(x).numpy(), source(x).numpy())


def test_round_trip_loads_in_place_and_returns_the_named_tuple():
    a, b = model(0), model(1)
    arrays = [t.array for t in b.state_dict(keep_vars=True).values()]
    result = b.load_state_dict(a.state_dict())
    assert result == ([], []) and result.missing_keys == [] and result.unexpected_keys == []
    assert repr(result) == "<All keys matched successfully>"
    assert all(t.array is arr for t, arr in zip(b.state_dict(keep_vars=True).values(), arrays))
    for key, value in a.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[key].numpy(), value.numpy(), err_msg=key)


def test_arrays_load_cast_to_the_parameter_dtype():
    m = model()
    state = {k: v.numpy().astype(np.float64) + 1 for k, v in model(1).state_dict().items()}
    m.load_state_dict(state)
    assert m[0].weight.dtype == np.float32
    np.testing.assert_allclose(m[0].weight.numpy(), state["0.weight"], rtol=1e-6)


def test_every_problem_is_listed_in_pytorchs_text():
    m = model()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    bad = dict(m.state_dict())
    del bad["0.bias"]
    bad["x.y"], bad["extra"] = sn.zeros(1), sn.zeros(1)
    bad["0.weight"] = sn.zeros(2, 2)
    with pytest.raises(RuntimeError) as info:
        m.load_state_dict(bad)
    assert str(info.value) == (
        'Error(s) in loading state_dict for Sequential:\n'
        '\tMissing key(s) in state_dict: "0.bias". \n'
        '\tUnexpected key(s) in state_dict: "x.y", "extra". \n'
        '\tsize mismatch for 0.weight: copying a param with shape (2, 2) from checkpoint, '
        'the shape in current model is (3, 2).')
    for key, value in m.state_dict().items():  # nothing was loaded
        np.testing.assert_array_equal(value.numpy(), before[key].numpy(), err_msg=key)


def test_non_strict_returns_the_keys_but_a_shape_mismatch_still_raises():
    m = model()
    result = m.load_state_dict({"0.weight": model(1)[0].weight.detach(), "z": sn.ones(1)},
                               strict=False)
    assert result.missing_keys == KEYS[1:6] + KEYS[6:] and result.unexpected_keys == ["z"]
    assert repr(result).startswith("_IncompatibleKeys(missing_keys=['0.bias'")
    np.testing.assert_array_equal(m[0].weight.numpy(), model(1)[0].weight.numpy())
    with pytest.raises(RuntimeError, match=r"\tsize mismatch for 0.weight: copying a param "
                                           r"with shape \(2, 2\)"):
        m.load_state_dict({"0.weight": np.zeros((2, 2), np.float32)}, strict=False)
    with pytest.raises(RuntimeError, match='While copying the parameter named "0.bias"'):
        m.load_state_dict({"0.bias": [1.0, 2.0, 3.0]}, strict=False)
    with pytest.raises(TypeError, match="dict-like"):
        m.load_state_dict([("0.bias", sn.ones(3))])


def test_assign_makes_the_given_tensors_the_parameters():
    m = model()
    m[0].weight.requires_grad_(False)
    new = {k: v.clone() + 1 for k, v in model(1).state_dict().items()}
    m.load_state_dict(new, assign=True)
    assert isinstance(m[0].weight, nn.Parameter) and not m[0].weight.requires_grad
    assert m[0].bias.requires_grad and m[0].bias.array is new["0.bias"].array
    assert m[1].running_mean is new["1.running_mean"]
    assert [p.array for p in m.parameters()][0] is new["0.weight"].array


def test_checkpoint_states_are_copies_that_training_does_not_change():
    m = model()
    opt = sn.optim.SGD(m.parameters(), lr=0.1)
    saved, _ = checkpoint_state.local_states(m, opt)
    frozen = {k: v.copy() for k, v in saved.items()}
    assert all(isinstance(v, np.ndarray) for v in saved.values())
    x = sn.tensor(np.random.default_rng(1).standard_normal((5, 2)).astype(np.float32))
    m(x).pow(2).sum().backward()
    opt.step()
    assert not np.array_equal(m[0].weight.numpy(), frozen["0.weight"])  # training went on
    for key, value in saved.items():
        np.testing.assert_array_equal(value, frozen[key], err_msg=key)
