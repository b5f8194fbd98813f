"""DistributedDataParallel under PyTorch's name and arguments (issue 24
item 3): training equals serial training on the global batch; PyTorch's
arguments map onto DataParallel; process groups; the errors."""
import numpy as np
import pytest

import spmdnet as torch
import spmdnet.distributed as dist
import spmdnet.nn.functional as F
from spmdnet import nn
from spmdnet.nn.parallel import DistributedDataParallel as DDP
from spmdnet.parallel import DataParallel

pytestmark = pytest.mark.mpi
GLOBAL_BATCH = 12  # divisible by 1, 2, 3 and 4 ranks


@pytest.fixture(scope="module", autouse=True)
def process_group():
    if not dist.is_initialized():
        dist.init_process_group("gloo")


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def data():
    rng = np.random.default_rng(1)
    return rng.standard_normal((GLOBAL_BATCH, 3)), rng.standard_normal((GLOBAL_BATCH, 2))


def train(net, x, y, steps=3):
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(net(torch.tensor(x)), torch.tensor(y)).backward()
        opt.step()


def test_ddp_equals_serial_training_on_the_global_batch():
    r, n = dist.get_rank(), dist.get_world_size()
    x, y = data()
    serial = model()
    train(serial, x, y)
    local = GLOBAL_BATCH // n
    ddp = DDP(model(), device_ids=None, bucket_cap_mb=0.0001, find_unused_parameters=True,
              gradient_as_bucket_view=True, static_graph=False)
    assert isinstance(ddp, DataParallel) and isinstance(ddp.module, nn.Sequential)
    train(ddp, x[r * local:(r + 1) * local], y[r * local:(r + 1) * local])
    for (name, p), q in zip(ddp.module.named_parameters(), serial.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=name)
    assert all(k.startswith("module.") for k in ddp.state_dict())  # PyTorch's keys
    ddp.close()


def test_ddp_no_sync_then_sync_equals_the_sum_of_two_batches():
    r, n = dist.get_rank(), dist.get_world_size()
    x, y = data()
    ddp = DDP(model(), device_ids=[0])
    mine = slice(r * (GLOBAL_BATCH // n), (r + 1) * (GLOBAL_BATCH // n))
    with ddp.no_sync():
        F.mse_loss(ddp(torch.tensor(x[mine])), torch.tensor(y[mine])).backward()
    F.mse_loss(ddp(torch.tensor(x[mine])), torch.tensor(y[mine])).backward()
    serial = model()
    (2 * F.mse_loss(serial(torch.tensor(x)), torch.tensor(y))).backward()
    for p, q in zip(ddp.module.parameters(), serial.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-10, atol=1e-12)
    ddp.close()


def test_ddp_over_a_process_group_averages_over_its_members():
    r, n = dist.get_rank(), dist.get_world_size()
    firsts = list(range(max(1, n // 2)))
    group = dist.new_group(firsts)
    if r not in firsts:
        with pytest.raises(ValueError, match="not in the process_group"):
            DDP(model(), process_group=group)
        return
    ddp = DDP(model(), process_group=group)
    out = ddp(torch.ones(1, 3, dtype=torch.float64))
    (out.sum() * (r + 1)).backward()
    serial = model()
    (serial(torch.ones(1, 3, dtype=torch.float64)).sum()
     * np.mean([i + 1 for i in firsts])).backward()
    for p, q in zip(ddp.module.parameters(), serial.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-10, atol=1e-12)
    ddp.close()


def test_ddp_arguments_pytorch_refuses_or_we_do_not_build():
    with pytest.raises(ValueError, match="device_ids"):
        DDP(model(), device_ids=[0, 1])
    with pytest.raises(NotImplementedError, match="mixed_precision"):
        DDP(model(), mixed_precision=object())
    with pytest.raises(TypeError, match="unexpected"):
        DDP(model(), bucket_size=3)
