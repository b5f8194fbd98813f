"""Every op that has a CPU kernel, on CuPy arrays on a real GPU: the lookup
gives CuPy arrays no kernel (numba.cuda twins measured 2x slower than CuPy's
own code on an H100 and were removed), so CuPy's code runs, and it must
match the NumPy run on the host, which takes the kernels. Skipped without
CuPy and a CUDA device."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import backend, kernels, optim

pytestmark = pytest.mark.gpu


def _tol(dtype):
    return {"rtol": 2e-4, "atol": 2e-5} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}


def _run(fn, arrays, device):
    """fn's output and every input's gradient, as host arrays."""
    ts = [sn.Tensor(backend.to_device(a, device), requires_grad=a.dtype.kind == "f")
          for a in arrays]
    out = fn(*ts)
    weights = backend.to_device(np.linspace(-1, 1, out.array.size).reshape(out.shape)
                                .astype(out.dtype), device)
    (out * sn.Tensor(weights)).sum().backward()
    return [backend.asnumpy(out.array)] + [backend.asnumpy(t.grad.array) for t in ts
                                          if t.grad is not None]


LINEAR = [(33, 17), (9, 17), (9,)]
CASES = {
    "linear_relu": (lambda x, w, b: F.linear(x, w, b, activation="relu"), LINEAR),
    "linear_gelu": (lambda x, w, b: F.linear(x, w, b, activation="gelu"), LINEAR),
    "gelu": (lambda x: F.gelu(x), [(5, 31)]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [(5, 31)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (40,), w, b), [(6, 40), (40,), (40,)]),
    "softmax": (lambda x: F.softmax(x, dim=-1), [(3, 5, 70)]),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_op_on_gpu_matches_xp_and_host(name, dtype):
    backend.require_cupy()
    fn, shapes = CASES[name]
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    assert kernels.lookup(name, backend.to_device(arrays[0], "gpu")) is None
    assert kernels.lookup(name, arrays[0]) is not None  # the host run takes the kernel
    with kernels.use("numba"):
        got = _run(fn, arrays, "gpu")
        host = _run(fn, arrays, "cpu")
    for g, h in zip(got, host, strict=True):
        np.testing.assert_allclose(g, h, **_tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_and_embedding_on_gpu(dtype):
    backend.require_cupy()
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((16, 10)).astype(dtype)
    labels = rng.integers(0, 10, 16)
    table = rng.standard_normal((12, 8)).astype(dtype)
    index = rng.integers(0, 12, (4, 5))

    def loss(lg, tb):
        emb = F.embedding(sn.Tensor(backend.to_device(index, backend.device_of(tb.array))), tb)
        return F.cross_entropy(lg, sn.Tensor(backend.to_device(labels, backend.device_of(
            lg.array)))) + (emb * emb).sum()

    with kernels.use("numba"):
        got = _run(loss, [logits, table], "gpu")
        host = _run(loss, [logits, table], "cpu")
    for g, h in zip(got, host, strict=True):
        np.testing.assert_allclose(g, h, **_tol(dtype))


@pytest.mark.parametrize("make", [lambda p: optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
                                  lambda p: optim.AdamW(p, lr=0.01, weight_decay=0.1)])
def test_optimizer_kernels_on_gpu_match_xp(make):
    backend.require_cupy()
    rng = np.random.default_rng(2)
    start = rng.standard_normal((64, 33)).astype(np.float32)
    grads = [rng.standard_normal(start.shape).astype(np.float32) for _ in range(3)]

    def train(device):
        p = sn.nn.Parameter(backend.to_device(start.copy(), device))
        opt = make([p])
        with kernels.use("numba"):
            for g in grads:
                p.grad = backend.to_device(g, device)
                opt.step()
        return backend.asnumpy(p.array)

    np.testing.assert_allclose(train("gpu"), train("cpu"), rtol=1e-5, atol=1e-6)
