"""A ResNet-style net (3x3 convolutions with stride 2 and padding 1,
BatchNorm2d, a 1x1 projection shortcut, ReLU, adaptive average pooling, a
linear head) trained under DataParallel equals one process on the global
batch: parameters and running statistics after a few SGD-momentum steps.

The parallel run uses SyncBatchNorm and the serial one plain BatchNorm: with
plain BatchNorm every rank would normalise by its own local batch's
statistics, which are not the global batch's, so DataParallel+BatchNorm is
not the serial run on the global batch (checked below too, at 2+ ranks).
Also a serial float64 gradcheck of one residual block (training-mode batch
statistics, every input and weight)."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, parallel
from spmdnet.autograd import gradcheck

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
LOCAL, STEPS = 2, 3


class Block(nn.Module):
    """Basic residual block, downsampling: 3x3/s2 -> BN -> ReLU -> 3x3 -> BN,
    plus a 1x1/s2 projection -> BN; ReLU of the sum."""

    def __init__(self, cin, cout):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout, momentum=0.2)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout, momentum=0.2)
        self.proj = nn.Conv2d(cin, cout, 1, stride=2, bias=False)
        self.bn_proj = nn.BatchNorm2d(cout, momentum=0.2)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.bn_proj(self.proj(x)))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(2, 3, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(3, momentum=0.2)
        self.block = Block(3, 4)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        x = self.block(F.relu(self.bn(self.stem(x))))
        return self.head(self.pool(x).flatten(1))


def make_model(sync):
    sn.manual_seed(0)
    model = ResNet()
    return nn.SyncBatchNorm.convert_sync_batchnorm(model) if sync else model


def data(rank, step):
    rng = np.random.default_rng(1000 * rank + step)
    return rng.standard_normal((LOCAL, 2, 8, 8)), rng.integers(0, 3, LOCAL)


def serial_steps(size):
    """One process, plain BatchNorm on the global batch (the ranks' batches in
    rank order); the loss is DataParallel's: the mean of the ranks' means."""
    model = make_model(sync=False)
    opt = sn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        batches = [data(r, step) for r in range(size)]
        out = model(sn.tensor(np.concatenate([b[0] for b in batches])))
        y = np.concatenate([b[1] for b in batches])
        opt.zero_grad()
        F.cross_entropy(out, y).backward()  # equal local batches: the same mean
        opt.step()
    return model


def parallel_steps(sync):
    model = make_model(sync)
    ddp = parallel.DataParallel(model)
    opt = sn.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = data(dist.rank(), step)
        opt.zero_grad()
        F.cross_entropy(ddp(sn.tensor(x)), y).backward()
        opt.step()
    ddp.close()
    return model


def max_difference(model, expected):
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
               zip(model.state_dict().values(), expected.state_dict().values(), strict=True))


def test_resnet_data_parallel_with_sync_batchnorm_equals_serial_global_batch():
    model, expected = parallel_steps(sync=True), serial_steps(dist.size())
    state, want = model.state_dict(), expected.state_dict()
    assert list(state) == list(want)
    assert any("running_var" in k for k in state)
    for (name, a), b in zip(state.items(), want.values()):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11,
                                   err_msg=name)


@pytest.mark.mpi(min_size=2)
def test_resnet_plain_batchnorm_under_data_parallel_is_not_the_global_batch():
    """Why the test above needs SyncBatchNorm: local statistics differ."""
    assert max_difference(parallel_steps(sync=False), serial_steps(dist.size())) > 1e-6


def test_residual_block_gradcheck():
    """Serial: input and the three convolution weights, BN in training mode
    with affine parameters, through the sum and the ReLUs."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 5, 5))
    w1, w2, wp = (rng.standard_normal(s) * 0.5 for s in ((3, 2, 3, 3), (3, 3, 3, 3),
                                                          (3, 2, 1, 1)))
    gamma, beta = sn.tensor(rng.standard_normal(3)), sn.tensor(rng.standard_normal(3))

    def bn(t):
        return F.batch_norm(t, None, None, gamma, beta, training=True)

    def block(x, w1, w2, wp):
        out = F.relu(bn(F.conv2d(x, w1, stride=2, padding=1)))
        out = bn(F.conv2d(out, w2, padding=1))
        return F.relu(out + bn(F.conv2d(x, wp, stride=2)))

    assert gradcheck(block, x, w1, w2, wp, rtol=1e-5, atol=1e-7)
