"""bfloat16 and CPU autocast against PyTorch 2.13's observed results
(tests/fixtures/torch_files/bfloat16_ops.pt), the float32 matmul precision
setting and the device predicates against PyTorch's documented values."""
import warnings
from pathlib import Path

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F

FIXTURE = Path(__file__).parent / "fixtures" / "torch_files" / "bfloat16_ops.pt"


@pytest.fixture(scope="module")
def ref():
    return sn.load(FIXTURE)


def _bits(t):
    return t.array.view(np.uint16)


def _ulps(got, want):
    """The distance in bfloat16 steps (same-sign values)."""
    return np.abs(_bits(got).astype(np.int32) - _bits(want).astype(np.int32))


def test_nanogpt_dtype_table_and_casts():
    dtype = {"float32": sn.float32, "bfloat16": sn.bfloat16, "float16": sn.float16}["bfloat16"]
    t = sn.tensor([1.5, -2.0], dtype=dtype)
    assert t.dtype == sn.bfloat16 and t.bfloat16() is t and t.is_floating_point()
    assert sn.ones(1).is_floating_point() and not sn.ones(1, dtype=sn.long).is_floating_point()
    assert t.float().dtype == sn.float32 and t.to(sn.bfloat16) is t
    assert sn.ones(3).to(sn.bfloat16).dtype == sn.bfloat16
    assert sn.zeros(2, dtype=sn.bfloat16).type() == "torch.BFloat16Tensor"
    assert sn.cuda.is_bf16_supported() is False  # no CUDA bfloat16 (CuPy has none)


def test_float32_to_bfloat16_rounds_as_pytorch(ref):
    """Ties to even, overflow to inf past bfloat16's largest, subnormals."""
    got = ref["ties"].bfloat16()
    assert np.array_equal(_bits(got), _bits(ref["ties_bf16"]))


ELEMENTWISE = {  # computed in float32 and rounded once: bit for bit PyTorch's
    "add": lambda a, b: a + b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "sub_scalar": lambda a, b: a - 0.3,
    "relu": lambda a, b: F.relu(a), "max": lambda a, b: a.max(),
}
# float32 transcendental functions and sums in another order than PyTorch's
# (SLEEF, its vectorised reductions): within one bfloat16 step. A Python
# number times bfloat16: PyTorch's CPU mul and div take the number in
# float32, its add and sub round it to bfloat16 first; spmdnet rounds it
# for all four (one step at most)
CLOSE = {"mul_scalar": lambda a, b: a * 2.7, "exp": lambda a, b: a.exp(),
         "tanh": lambda a, b: a.tanh(), "sum": lambda a, b: a.sum(), "mean": lambda a, b: a.mean(),
         "cumsum": lambda a, b: a.cumsum(0)}


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_bit_for_bit(ref, name):
    got = ELEMENTWISE[name](ref["a"], ref["b"])
    assert got.dtype == sn.bfloat16
    assert np.array_equal(_bits(got), _bits(ref[name]))


@pytest.mark.parametrize("name", list(CLOSE))
def test_transcendental_and_reductions_within_one_step(ref, name):
    got = CLOSE[name](ref["a"], ref["b"])
    assert got.dtype == sn.bfloat16
    assert _ulps(got, ref[name]).max() <= 1


def test_reductions_accumulate_in_float32(ref):
    """1000 terms summed in bfloat16 steps would drift far from PyTorch's
    float32 accumulation; ours equals it to one step."""
    a = ref["a"].array
    drift = np.add.reduce(a, dtype=sn.bfloat16)  # rounded at every addition
    want = ref["sum"].array.astype(np.float32)
    assert abs(float(drift) - float(want)) > abs(float(ref["a"].sum().float()) - float(want))


def test_matmul_softmax_and_promotion(ref):
    mm = ref["m1"] @ ref["m2"]
    assert mm.dtype == sn.bfloat16 and _ulps(mm, ref["matmul"]).max() <= 1
    sm = F.softmax(ref["m1"], -1)
    assert sm.dtype == sn.bfloat16 and _ulps(sm, ref["softmax"]).max() <= 1
    wide = ref["a"] + ref["b"].float()  # float32 beside bfloat16: float32, exactly PyTorch's
    assert wide.dtype == sn.float32
    np.testing.assert_array_equal(wide.numpy(), ref["add_f32"].numpy())


def test_bfloat16_save_load_round_trip(tmp_path, ref):
    sn.save({"a": ref["a"], "view": ref["a"][3:9]}, tmp_path / "bf.pt")
    back = sn.load(tmp_path / "bf.pt")
    assert back["a"].dtype == sn.bfloat16
    assert np.array_equal(_bits(back["a"]), _bits(ref["a"]))
    assert np.shares_memory(back["a"].array, back["view"].array)


def test_cpu_autocast_as_pytorch(ref):
    """Linear and conv2d take bfloat16-rounded inputs and return bfloat16;
    cross-entropy computes in float32; float32 parameters get float32
    gradients that passed through bfloat16."""
    w = sn.tensor(ref["ac_w"].numpy(), requires_grad=True)
    bias = sn.tensor(ref["ac_bias"].numpy(), requires_grad=True)
    wc = sn.tensor(ref["ac_wc"].numpy(), requires_grad=True)
    assert not sn.amp.is_autocast_enabled("cpu")
    with sn.autocast("cpu", dtype=sn.bfloat16):
        assert sn.amp.is_autocast_enabled("cpu") and not sn.amp.is_autocast_enabled("cuda")
        y = F.linear(ref["ac_x"], w, bias)
        loss = F.cross_entropy(F.relu(y), ref["ac_target"])
        yc = F.conv2d(ref["ac_xc"], wc, padding=1)
        lc = yc.float().square().mean()
        with sn.autocast("cpu", enabled=False):
            assert (ref["ac_x"] @ w.T).dtype == sn.float32
    assert not sn.amp.is_autocast_enabled("cpu")
    assert (y.dtype, yc.dtype, loss.dtype) == (sn.bfloat16, sn.bfloat16, sn.float32)
    assert _ulps(y, ref["ac_y"]).max() <= 1 and _ulps(yc, ref["ac_yc"]).max() <= 1
    np.testing.assert_allclose(loss.item(), ref["ac_loss"].item(), rtol=1e-2)
    (loss + lc).backward()
    for got, name in ((w, "ac_w_grad"), (bias, "ac_bias_grad"), (wc, "ac_wc_grad")):
        assert got.grad.dtype == sn.float32
        want = ref[name].numpy()
        assert np.abs(got.grad.numpy() - want).max() <= 2e-2 * np.abs(want).max(), name


def test_autocast_float16_and_cuda_refused_by_name():
    with pytest.raises(NotImplementedError, match="float16"):
        sn.autocast("cpu", dtype=sn.float16)
    assert sn.amp.get_autocast_dtype("cpu") == sn.bfloat16


def test_float32_matmul_precision_as_pytorch():
    assert sn.get_float32_matmul_precision() == "highest"
    try:
        for value in ("high", "medium", "highest"):
            sn.set_float32_matmul_precision(value)
            assert sn.get_float32_matmul_precision() == value
        sn.set_float32_matmul_precision("medium")
        with pytest.warns(UserWarning, match="low is not one of 'highest', 'high', or 'medium'"):
            sn.set_float32_matmul_precision("low")
        assert sn.get_float32_matmul_precision() == "medium"  # no effect, as PyTorch
        with pytest.raises(TypeError, match="must be str"):
            sn.set_float32_matmul_precision(3)
    finally:
        with warnings.catch_warnings():
            sn.set_float32_matmul_precision("highest")


def test_device_predicates_as_pytorch():
    t = sn.ones(2)
    assert t.is_cpu is True and t.is_cuda is False
    for name in ("is_xpu", "is_mps", "is_meta", "is_ipu", "is_maia", "is_mtia", "is_vulkan",
                 "is_xla", "is_quantized", "is_sparse", "is_sparse_csr", "is_mkldnn",
                 "is_nested"):
        assert getattr(t, name) is False, name


def test_bfloat16_leaf_requires_grad_and_gets_a_bfloat16_gradient():
    # PyTorch: a bfloat16 leaf may require gradients; d(sum(t*t))/dt = 2t, in bfloat16
    t = sn.tensor([1.0, 2.5, -3.0], dtype=sn.bfloat16, requires_grad=True)
    (t * t).sum().backward()
    assert t.grad.dtype == sn.bfloat16
    np.testing.assert_array_equal(t.grad.float().numpy(), [2.0, 5.0, -6.0])
    with pytest.raises(TypeError, match="floating point"):
        sn.tensor([1, 2]).requires_grad_()
