"""spmdnet.device, Tensor.device, the default-device context, spmdnet.cuda,
accelerator, backends flags, compile, amp (disabled as PyTorch's; refusing
lower precision) and nn.DataParallel. Expected values are PyTorch 2.13's
documented answers (checked in the peer venv), on a machine without a GPU
unless a test says otherwise."""
import pickle
import warnings

import numpy as np
import pytest

import spmdnet as sn

no_gpu = pytest.mark.skipif(sn.cuda.is_available(), reason="checks the CPU-only answers")
needs_gpu = pytest.mark.skipif(not sn.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("args, kind, index, text, representation", [
    (("cpu",), "cpu", None, "cpu", "device(type='cpu')"),
    (("cuda",), "cuda", None, "cuda", "device(type='cuda')"),
    (("cuda:1",), "cuda", 1, "cuda:1", "device(type='cuda', index=1)"),
    (("cuda", 2), "cuda", 2, "cuda:2", "device(type='cuda', index=2)"),
    ((3,), "cuda", 3, "cuda:3", "device(type='cuda', index=3)"),
    ((sn.device("cuda:0"),), "cuda", 0, "cuda:0", "device(type='cuda', index=0)"),
])
def test_device_parsing(args, kind, index, text, representation):
    dev = sn.device(*args)
    assert (dev.type, dev.index, str(dev), repr(dev)) == (kind, index, text, representation)


@pytest.mark.parametrize("args", [("cuda:x",), ("tpu",), ("cuda:1", 2), ("cuda", -1),
                                  ("cuda", True), ("cpu", 3)])
def test_bad_devices_name_the_value(args):
    with pytest.raises(ValueError, match="device"):
        sn.device(*args)


def test_equality_and_hashing():
    assert sn.device("cuda", 0) == sn.device("cuda:0") != sn.device("cuda")
    assert sn.device("cpu") == "cpu" and sn.device("cuda:1") == "cuda:1"
    assert sn.device("cuda:1") == "gpu"  # spmdnet's internal name of the rank's GPU
    assert sn.device("cpu") != "cuda" and sn.device("cpu") != "nonsense"
    assert {sn.device("cuda:0"): 1}[sn.device("cuda", 0)] == 1
    assert hash(sn.device("cpu")) == hash("cpu")


def test_a_device_is_the_string_pytorch_prints_and_immutable():
    dev = sn.device("cuda", 1)
    assert isinstance(dev, str) and type(str(dev)) is str and f"{dev}" == "cuda:1"
    assert pickle.loads(pickle.dumps(dev)) == dev and repr(pickle.loads(pickle.dumps(dev))) \
        == "device(type='cuda', index=1)"
    with pytest.raises(AttributeError, match="immutable"):
        dev.index = 0


def test_module_to_takes_a_device():
    model = sn.nn.Linear(2, 2)
    device = sn.device("cuda" if sn.cuda.is_available() else "cpu")
    assert model.to(device) is model
    assert model.weight.device == device or model.weight.device.type == device.type


def test_tensor_device_is_a_device():
    t = sn.zeros(2)
    assert isinstance(t.device, sn.device) and t.device.type == "cpu" and t.device.index is None
    assert t.device == "cpu" == sn.device("cpu")


def test_to_accepts_device_objects():
    t = sn.ones(3)
    assert t.to(sn.device("cpu")) is t
    out = t.to(sn.device("cpu"), sn.float64)
    assert out.dtype == np.float64 and out.device.type == "cpu"
    assert t.to(device=sn.device("cpu")) is t


def test_default_device_context():
    assert sn.get_default_device() == sn.device("cpu")
    with sn.device("cpu") as dev:
        assert dev == "cpu" and sn.get_default_device() is dev
        assert sn.zeros(2).device.type == "cpu"
    sn.set_default_device("cpu")
    try:
        assert sn.get_default_device() == "cpu"
    finally:
        sn.set_default_device(None)


@no_gpu
def test_default_cuda_device_routes_creation_to_the_gpu():
    """Creation under `with device("cuda")` asks for the GPU: without one it
    fails (PyTorch raises too); outside the block the CPU is used again."""
    with sn.device("cuda"), pytest.raises((ImportError, RuntimeError)):
        sn.zeros(2)
    assert sn.zeros(2).device == "cpu"


@no_gpu
def test_cuda_without_a_gpu():
    assert sn.cuda.is_available() is False and sn.cuda.device_count() == 0
    assert sn.cuda.memory_allocated() == 0 and sn.cuda.memory_reserved() == 0
    assert sn.cuda.is_bf16_supported() is False
    sn.cuda.empty_cache()
    for call in (sn.cuda.current_device, sn.cuda.synchronize, sn.cuda.get_device_name):
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            call()
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        sn.cuda.set_device(0)


@no_gpu
def test_cuda_manual_seed_leaves_the_host_generator_alone():
    sn.manual_seed(5)
    reference = sn.rand(4).array
    sn.manual_seed(5)
    sn.cuda.manual_seed(123)
    sn.cuda.manual_seed_all(9)
    np.testing.assert_array_equal(sn.rand(4).array, reference)


@no_gpu
def test_accelerator_without_a_gpu():
    acc = sn.accelerator
    assert acc.is_available() is False and acc.current_accelerator() is None
    assert acc.device_count() == 0


def test_backends_flags_have_pytorchs_defaults_and_keep_what_is_set(monkeypatch):
    b = sn.backends
    assert b.cuda.matmul.allow_tf32 is False and b.mps.is_available() is False
    assert (b.cudnn.enabled, b.cudnn.benchmark, b.cudnn.deterministic) == (True, False, False)
    monkeypatch.setattr(b.cudnn, "benchmark", True)
    monkeypatch.setattr(b.cuda.matmul, "allow_tf32", True)
    import spmdnet.backends.cudnn as cudnn  # noqa: PLC0415 - PyTorch programs import it so
    assert cudnn.benchmark is True and sn.backends.cuda.matmul.allow_tf32 is True


def test_compile_returns_the_model():
    model = sn.nn.Linear(2, 2)
    assert sn.compile(model) is model
    assert sn.compile(model, mode="max-autotune", fullgraph=True) is model

    @sn.compile(dynamic=True)
    def double(x):
        return 2 * x

    assert double(3) == 6


def _train(steps, wrap):
    """Two SGD steps; ``wrap`` gets (model, optimizer, loss_fn) and returns one step."""
    sn.manual_seed(0)
    model = sn.nn.Linear(3, 1)
    opt = sn.optim.SGD(model.parameters(), lr=0.1)
    x, y = sn.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3)), sn.tensor([[1.0], [-1.0]])
    step = wrap(model, opt, lambda: ((model(x) - y) ** 2).mean())
    for _ in range(steps):
        step()
    return model.weight.array.copy(), model.bias.array.copy()


def test_disabled_autocast_and_scaler_train_exactly_as_without_them():
    def plain(model, opt, loss_fn):
        def step():
            opt.zero_grad()
            loss_fn().backward()
            opt.step()
        return step

    def amp(model, opt, loss_fn):
        scaler = sn.amp.GradScaler("cpu", enabled=False)

        def step():
            opt.zero_grad()
            with sn.autocast("cpu", enabled=False):
                loss = loss_fn()
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            assert scaler.step(opt) is None
            scaler.update()
        return step

    for got, want in zip(_train(2, amp), _train(2, plain)):
        np.testing.assert_array_equal(got, want)


def test_disabled_scaler_answers_as_pytorchs():
    scaler = sn.amp.GradScaler(enabled=False)
    loss = sn.tensor(2.0, requires_grad=True)
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0
    assert scaler.state_dict() == {} and scaler.is_enabled() is False
    assert scaler.load_state_dict({"scale": 8.0}) is None and scaler.get_scale() == 1.0


def test_autocast_decorator_runs_the_function():
    @sn.autocast("cpu", enabled=False)
    def f(x):
        return x + 1

    assert f(1) == 2 and sn.amp.is_autocast_enabled() is False


def test_float16_is_refused_not_faked():
    """CPU autocast to bfloat16 runs (tests/test_bfloat16.py); float16 is refused."""
    with pytest.raises(NotImplementedError, match="float16"):
        sn.amp.autocast("cpu", dtype=sn.float16)
    with pytest.raises(NotImplementedError, match="enabled=False"):
        sn.amp.GradScaler("cpu")
    with pytest.raises(ValueError, match="device_type"):
        sn.autocast("tpu")


@no_gpu
def test_cuda_amp_without_a_gpu_disables_itself_with_pytorchs_warnings():
    with pytest.warns(UserWarning) as record:
        ctx = sn.autocast("cuda")
        scaler = sn.amp.GradScaler("cuda")
        old_scaler = sn.cuda.amp.GradScaler()
        with sn.cuda.amp.autocast():
            pass
    off = "CUDA is not available or torch_xla is imported. Disabling autocast."
    scaler_off = "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling."
    assert [str(w.message) for w in record] == [off, scaler_off, scaler_off, off]
    assert not scaler.is_enabled() and not old_scaler.is_enabled()
    with ctx:
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sn.autocast("cuda", enabled=False)
        sn.amp.GradScaler("cuda", enabled=False)


@needs_gpu
def test_cuda_amp_on_a_gpu_refuses():
    with pytest.raises(NotImplementedError, match="float16"):
        sn.autocast("cuda")


@no_gpu
def test_data_parallel_without_gpus_calls_the_module():
    inner = sn.nn.Linear(3, 2)
    wrapped = sn.nn.DataParallel(inner)
    x = sn.tensor(np.ones((4, 3), np.float32))
    np.testing.assert_array_equal(wrapped(x).array, inner(x).array)
    assert wrapped.module is inner
    assert sorted(wrapped.state_dict()) == ["module.bias", "module.weight"]
    assert [id(p) for p in wrapped.parameters()] == [id(p) for p in inner.parameters()]


@needs_gpu
def test_gpu_device_and_cuda_answers():
    t = sn.zeros(2, device="cuda")
    assert t.device.type == "cuda" and t.device.index == sn.cuda.current_device()
    assert t.device == "gpu" and t.to("cpu").device == "cpu"
    assert sn.cuda.device_count() >= 1 and isinstance(sn.cuda.get_device_name(), str)
    major, minor = sn.cuda.get_device_capability()
    assert major >= 3
    sn.cuda.synchronize()
    with sn.device("cuda"):
        assert sn.ones(2).device.type == "cuda"
    assert sn.accelerator.current_accelerator() == sn.device("cuda")
    assert sn.cuda.memory_allocated() > 0


@pytest.mark.skipif(sn.cuda.device_count() < 2, reason="needs two GPUs")
def test_data_parallel_over_several_gpus_points_to_ddp():
    with pytest.raises(NotImplementedError, match="DistributedDataParallel"):
        sn.nn.DataParallel(sn.nn.Linear(2, 2))
