"""GPU paths (need CuPy and a CUDA device; skipped elsewhere): collectives on
device buffers give the same results through CUDA-aware MPI and through
pinned host staging, DataParallel on GPU equals the CPU run, and each rank
uses device local_rank % device_count. Skipped too under SPMDNET_DEVICE=cpu."""
import os

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import backend, dist, nn, parallel
from spmdnet.distributed import transport

pytestmark = [pytest.mark.mpi, pytest.mark.gpu,
              pytest.mark.skipif(os.environ.get("SPMDNET_DEVICE") == "cpu",
                                 reason="SPMDNET_DEVICE=cpu keeps every rank on the CPU")]


@pytest.fixture(params=["1", "0"])
def cuda_aware(request, monkeypatch):
    """Both transports: device buffers to MPI, and host staging."""
    monkeypatch.delenv("SPMDNET_CUDA_AWARE", raising=False)
    aware, how = transport.probe_cuda_aware()  # the library's own answer, not the knob's
    if request.param == "1" and not aware:
        pytest.skip(f"this MPI is not CUDA-aware ({how})")
    monkeypatch.setenv("SPMDNET_CUDA_AWARE", request.param)
    transport._decision.clear()
    yield request.param
    transport._decision.clear()


def test_device_is_local_rank_modulo_count():
    cp = backend.require_cupy()
    w = dist.init()
    assert w.device == "gpu"
    assert cp.cuda.Device().id == w.local_rank % backend.gpu_count()


def test_allreduce_and_allgather_on_device(cuda_aware):
    cp = backend.require_cupy()
    x = cp.arange(17, dtype=cp.float32) + dist.rank()
    dist.allreduce(x, op="sum")
    n = dist.size()
    np.testing.assert_array_equal(x.get(), n * np.arange(17) + n * (n - 1) / 2)
    out = dist.allgather(cp.full(3, float(dist.rank())))
    np.testing.assert_array_equal(out.get()[:, 0], np.arange(n))


def test_data_parallel_on_gpu_equals_cpu(cuda_aware):
    def run(device):
        sn.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).to(device)
        ddp = parallel.DataParallel(model)
        x = backend.to_device(np.random.default_rng(dist.rank()).standard_normal((4, 5))
                              .astype(np.float32), device)
        F.cross_entropy(ddp(sn.Tensor(x)), backend.to_device(np.arange(4) % 3, device)).backward()
        grads = [backend.asnumpy(p.grad.array) for p in model.parameters()]
        ddp.close()
        return grads
    for g_cpu, g_gpu in zip(run("cpu"), run("gpu")):
        np.testing.assert_allclose(g_gpu, g_cpu, rtol=1e-5, atol=1e-6)
