"""Creation functions with PyTorch's signatures and dtypes, type and device
conversions (float() / double() / to(...) / type_as), and NumPy interop
(``np.asarray(t)``, ufuncs on tensors)."""
import numpy as np
import pytest

import spmdnet as sn

F32, F64, I64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)

# name, call, expected values (a NumPy expression or hand values), expected dtype
CASES = [
    ("tensor_floats", lambda: sn.tensor([1.0, 2.5]), [1.0, 2.5], F32),
    ("tensor_ints", lambda: sn.tensor([[1, 2], [3, 4]]), [[1, 2], [3, 4]], I64),
    ("tensor_bools", lambda: sn.tensor([True, False]), [True, False], np.bool_),
    ("tensor_dtype", lambda: sn.tensor([1, 2], dtype=sn.float64), [1.0, 2.0], F64),
    ("tensor_array_keeps", lambda: sn.tensor(np.ones(2, np.float64)), [1.0, 1.0], F64),
    ("zeros_varargs", lambda: sn.zeros(2, 3), np.zeros((2, 3)), F32),
    ("zeros_tuple", lambda: sn.zeros((2, 3)), np.zeros((2, 3)), F32),
    ("zeros_list_dtype", lambda: sn.zeros([4], dtype=sn.long), np.zeros(4), I64),
    ("ones", lambda: sn.ones(3, dtype=np.float64), np.ones(3), F64),
    ("ones_0d", lambda: sn.ones(()), np.ones(()), F32),
    ("full_float", lambda: sn.full((2, 2), 1.5), np.full((2, 2), 1.5), F32),
    ("full_int", lambda: sn.full((2,), 7), [7, 7], I64),
    ("full_bool", lambda: sn.full([2], True), [True, True], np.bool_),
    ("arange_int", lambda: sn.arange(5), [0, 1, 2, 3, 4], I64),
    ("arange_start_step", lambda: sn.arange(1, 10, 3), [1, 4, 7], I64),
    ("arange_float", lambda: sn.arange(0, 1, 0.25), [0.0, 0.25, 0.5, 0.75], F32),
    ("arange_float_end", lambda: sn.arange(3.0), [0.0, 1.0, 2.0], F32),
    ("arange_dtype", lambda: sn.arange(3, dtype=sn.float64), [0.0, 1.0, 2.0], F64),
    ("arange_negative_step", lambda: sn.arange(3, 0, -1), [3, 2, 1], I64),
    ("linspace", lambda: sn.linspace(0, 1, 5), [0.0, 0.25, 0.5, 0.75, 1.0], F32),
    ("linspace_one", lambda: sn.linspace(-1, 1, 1), [-1.0], F32),
    ("eye", lambda: sn.eye(3), np.eye(3), F32),
    ("eye_rect", lambda: sn.eye(2, 3, dtype=sn.float64), np.eye(2, 3), F64),
    ("zeros_like", lambda: sn.zeros_like(sn.ones(2, dtype=sn.long)), [0, 0], I64),
    ("ones_like_dtype", lambda: sn.ones_like(sn.ones(2), dtype=sn.float64), [1.0, 1.0], F64),
    ("full_like", lambda: sn.full_like(sn.zeros(2, 2), 3.0), np.full((2, 2), 3.0), F32),
    ("tril", lambda: sn.tril(sn.ones(2, 2)), [[1, 0], [1, 1]], F32),
    ("triu", lambda: sn.triu(sn.ones(2, 3), diagonal=1), [[0, 1, 1], [0, 0, 1]], F32),
    ("cat", lambda: sn.cat([sn.arange(2), sn.arange(3)]), [0, 1, 0, 1, 2], I64),
    ("concatenate", lambda: sn.concatenate([sn.ones(1), sn.zeros(1)]), [1, 0], F32),
    ("stack", lambda: sn.stack([sn.arange(2), sn.arange(2)], dim=1), [[0, 0], [1, 1]], I64),
]


@pytest.mark.parametrize("name,make,want,dtype", CASES, ids=[c[0] for c in CASES])
def test_creation_values_and_dtype(name, make, want, dtype):
    out = make()
    assert isinstance(out, sn.Tensor)
    assert out.dtype == dtype
    assert out.shape == np.shape(want)
    np.testing.assert_array_equal(out.numpy(), np.asarray(want))


def test_float_creation_follows_default_dtype():
    sn.set_default_dtype(np.float64)
    try:
        for t in (sn.zeros(2), sn.ones(2), sn.rand(2), sn.randn(2), sn.arange(0.0, 2.0),
                  sn.linspace(0, 1, 3), sn.eye(2), sn.full((2,), 0.5), sn.tensor([0.5])):
            assert t.dtype == F64
        assert sn.arange(3).dtype == I64
    finally:
        sn.set_default_dtype(np.float32)


def test_requires_grad_and_device_arguments():
    t = sn.zeros(2, 3, requires_grad=True)
    assert t.requires_grad and t.is_leaf and t.device == "cpu"
    assert sn.ones(2, device="cpu").device == "cpu"
    assert sn.empty(2, 3).shape == (2, 3) and sn.empty((4,), dtype=sn.long).dtype == I64
    assert sn.empty_like(t).shape == (2, 3)
    (t * 2).sum().backward()
    np.testing.assert_array_equal(np.asarray(t.grad), np.full((2, 3), 2.0))
    with pytest.raises(TypeError):
        sn.arange(3, requires_grad=True)  # integers cannot require grad
    with pytest.raises(ValueError, match="device"):
        sn.zeros(2, device="tpu")


def test_random_draws_follow_manual_seed():
    sn.manual_seed(5)
    a = (sn.rand(3, 4), sn.randn((3, 4)), sn.randint(0, 10, (5,)), sn.randint(3, size=(4,)),
         sn.randperm(6))
    sn.manual_seed(5)
    b = (sn.rand(3, 4), sn.randn((3, 4)), sn.randint(0, 10, (5,)), sn.randint(3, size=(4,)),
         sn.randperm(6))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    rand, randn, ints, small, perm = a
    assert rand.dtype == F32 and randn.dtype == F32 and ints.dtype == I64 == perm.dtype
    assert 0 <= rand.numpy().min() and rand.numpy().max() < 1
    assert ints.numpy().min() >= 0 and ints.numpy().max() < 10 and small.numpy().max() < 3
    assert sorted(perm.tolist()) == list(range(6))
    assert sn.randn(2, dtype=sn.float64).dtype == F64
    assert sn.rand(2, dtype=sn.half).dtype == np.float16
    assert sn.randn(2, requires_grad=True).requires_grad
    assert sn.randn_like(sn.zeros(2, 3, dtype=sn.float64)).dtype == F64


def test_randn_statistics_and_independence_of_numpy_global():
    np.random.seed(0)
    before = np.random.random()
    np.random.seed(0)
    sn.manual_seed(1)
    x = sn.randn(20000).numpy()
    assert np.random.random() == before  # spmdnet's generator, not NumPy's global one
    assert abs(x.mean()) < 0.03 and abs(x.std() - 1) < 0.03


def test_tensor_copies_and_as_tensor_shares():
    a = np.zeros(3, np.float32)
    t = sn.tensor(a)
    t.data[0] = 1
    assert a[0] == 0
    s = sn.as_tensor(a)
    s.data[1] = 2
    assert a[1] == 2 and np.shares_memory(sn.from_numpy(a).array, a)
    assert sn.is_tensor(t) and not sn.is_tensor(a)


# -- type conversions --------------------------------------------------------------
CASTS = [
    ("float", lambda t: t.float(), F32), ("double", lambda t: t.double(), F64),
    ("half", lambda t: t.half(), np.float16), ("long", lambda t: t.long(), I64),
    ("int", lambda t: t.int(), np.int32), ("bool", lambda t: t.bool(), np.bool_),
    ("to_dtype", lambda t: t.to(sn.float64), F64), ("to_kw", lambda t: t.to(dtype=sn.long), I64),
    ("to_device_dtype", lambda t: t.to("cpu", sn.float16), np.float16),
    ("to_tensor", lambda t: t.to(sn.zeros(1, dtype=sn.int32)), np.int32),
    ("type_as", lambda t: t.type_as(sn.zeros(1, dtype=sn.float64)), F64),
]


@pytest.mark.parametrize("name,fn,dtype", CASTS, ids=[c[0] for c in CASTS])
def test_conversions(name, fn, dtype):
    values = np.array([-1.5, 0.0, 2.7], np.float32)
    out = fn(sn.tensor(values))
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.numpy(), values.astype(dtype))


def test_float_conversions_keep_the_graph_others_leave_it():
    x = sn.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    y = x.double()
    assert y.dtype == F64 and y.requires_grad and not y.is_leaf
    (y * sn.tensor([3.0, 4.0], dtype=sn.float64)).sum().backward()
    assert x.grad.dtype == F32
    np.testing.assert_array_equal(np.asarray(x.grad), [3.0, 4.0])
    assert not x.long().requires_grad and not x.bool().requires_grad
    assert x.float() is x and x.to(sn.float32) is x and x.to("cpu") is x


def test_to_copy_and_device_names():
    x = sn.ones(2)
    c = x.to(sn.float32, copy=True)
    assert c is not x and not np.shares_memory(c.array, x.array)
    assert x.to("cpu") is x and x.cpu() is x
    with pytest.raises(ValueError):
        x.to("tpu")


def test_python_scalars_from_one_element_tensors():
    assert float(sn.tensor([[2.5]])) == 2.5 and int(sn.tensor(3.9)) == 3
    assert isinstance(float(sn.tensor(1, dtype=sn.long)), float)
    with pytest.raises(RuntimeError, match="2 elements"):
        float(sn.ones(2))
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(sn.ones(2))
    assert bool(sn.ones(1)) and not bool(sn.zeros(()))


def test_dtype_names_are_pytorchs():
    assert sn.float is sn.float32 and sn.float32 == np.float32
    assert sn.long == np.int64 and sn.int == np.int32 and sn.double == np.float64
    assert sn.half == np.float16 and sn.bool == np.bool_
    assert "float" not in sn.__all__  # `from spmdnet import *` keeps Python's float


# -- NumPy interop -----------------------------------------------------------------
def test_asarray_of_a_tensor():
    t = sn.tensor([[1.0, 2.0]])
    a = np.asarray(t)
    assert isinstance(a, np.ndarray) and a.dtype == F32 and a.shape == (1, 2)
    assert np.shares_memory(a, t.array)
    assert np.asarray(t, dtype=np.float64).dtype == F64
    np.testing.assert_array_equal(t, [[1.0, 2.0]])
    with pytest.raises(RuntimeError, match="requires grad"):
        np.asarray(sn.ones(2, requires_grad=True))


def test_numpy_ufunc_on_a_tensor_that_requires_grad_raises():
    w = sn.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="graph"):
        np.exp(w)
    with pytest.raises(RuntimeError, match="graph"):
        np.sin(w)


def test_numpy_ufunc_on_a_plain_tensor_returns_a_tensor():
    t = sn.tensor([0.0, 1.0])
    out = np.exp(t)
    assert isinstance(out, sn.Tensor)
    np.testing.assert_allclose(out.numpy(), np.exp([0.0, 1.0]), rtol=1e-6)


def test_array_operator_tensor_keeps_the_graph():
    w = sn.tensor(np.array([1.0, 2.0]), requires_grad=True)
    a = np.array([3.0, 5.0])
    out = a * w + a - w / a
    assert isinstance(out, sn.Tensor) and out.requires_grad
    out.sum().backward()
    np.testing.assert_allclose(np.asarray(w.grad), a - 1 / a)
    assert isinstance(np.array([1.0, 2.0]) < sn.tensor([2.0, 1.0]), sn.Tensor)
    m = np.eye(2) @ w
    assert isinstance(m, sn.Tensor) and m.requires_grad


@pytest.mark.gpu
def test_creation_and_moves_on_the_gpu():
    for t in (sn.zeros(2, 3, device="gpu"), sn.ones(2, device="cuda"), sn.arange(4, device="gpu"),
              sn.full((2,), 1.5, device="cuda:0"), sn.eye(3, device="gpu"),
              sn.rand(3, device="gpu"), sn.randn(3, dtype=sn.float64, device="gpu"),
              sn.randint(0, 5, (4,), device="gpu"), sn.randperm(5, device="gpu"),
              sn.zeros_like(sn.ones(2, device="gpu")), sn.tensor([1.0], device="gpu")):
        assert t.device == "gpu" and t.is_cuda
    sn.manual_seed(2)
    a = sn.randn(5, device="gpu").numpy()
    sn.manual_seed(2)
    np.testing.assert_array_equal(a, sn.randn(5, device="gpu").numpy())
    x = sn.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    y = x.to("gpu", sn.float64)
    assert y.device == "gpu" and y.dtype == F64 and y.requires_grad
    (y * 3).sum().cpu().backward()
    assert x.grad.dtype == F32
    np.testing.assert_array_equal(np.asarray(x.grad), [3.0, 3.0])
    with pytest.raises(TypeError):
        np.asarray(y.detach())
    g = sn.arange(6, device="gpu", dtype=sn.float32).view(2, 3)
    assert g[sn.tensor([True, False])].tolist() == [[0.0, 1.0, 2.0]]  # host mask, GPU tensor


def test_numpy_scalars_keep_their_dtype_as_in_pytorch():
    assert sn.tensor(np.float64(2.0)).dtype == np.float64  # torch.tensor(np.float64(2.)) too
    assert sn.tensor(np.int32(3)).dtype == np.int32
    assert sn.tensor(2.0).dtype == sn.get_default_dtype()  # a Python float: the default
    assert (sn.ones(3) * np.float64(2.0)).dtype == np.float32  # 0-dim does not promote
