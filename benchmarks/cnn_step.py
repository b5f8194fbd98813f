"""Training-step speed of the course CIFAR-10 CNN against an im2col floor.

    python benchmarks/cnn_step.py [--steps 30] [--threads 1]

The DeepSpeed tutorial's CIFAR-10 net: Conv2d(3,6,5) -> ReLU -> MaxPool2d(2,2)
-> Conv2d(6,16,5) -> ReLU -> MaxPool2d(2,2) -> view(-1, 400) -> 120 -> 84 -> 10,
batch 64, 3x32x32, float32, SGD with momentum, cross-entropy. In a fresh
process per BLAS thread count it times, interleaved:
  floor  the matrix products of an im2col formulation of the same forward and
         backward: conv1 (50176x75)(75x6), conv2 (6400x150)(150x16), the three
         linear layers, every weight gradient and every input gradient but
         the first layer's; the column matrices are built before timing
  ours   a spmdnet step: model(x), F.cross_entropy, backward, opt.step()
  xp     the same step with SPMDNET_KERNELS=xp (no Numba kernels)
and prints median times and ours/floor (issue 15's goal: <= 1.8). In the same
run, alongside: a ResNet-style net (stem 3x3 conv 3->16, two downsampling
basic blocks 16->32->64 with 3x3/s2 convolutions, padding 1, BatchNorm2d and
1x1/s2 projection shortcuts, ReLU, adaptive average pooling, Linear(64, 10)),
batch 64, its step (res_ms) against its own im2col GEMM floor (res_floor: the
forward, weight-gradient and input-gradient products of every convolution,
the stem's input gradient excepted, on prebuilt column matrices).
"""
import os

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn
from spmdnet.launch import thread_sweep

from mlp_step import build_ours, median_times  # benchmarks/ is on the path of a script run

BATCH = 64


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.pool = nn.Conv2d(3, 6, 5), nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Block(nn.Module):
    """Basic residual block, downsampling by 2, with a 1x1 projection."""

    def __init__(self, cin, cout):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=2, bias=False),
                                  nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.proj(x))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(Block(16, 32), Block(32, 64))
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.pool(self.blocks(self.stem(x))).flatten(1))


# ResNet's convolutions: (cin, cout, kernel, output side, needs input gradient)
RES_CONVS = ((3, 16, 3, 32, False), (16, 32, 3, 16, True), (32, 32, 3, 16, True),
             (16, 32, 1, 16, True), (32, 64, 3, 8, True), (64, 64, 3, 8, True),
             (32, 64, 1, 8, True))


def res_floor_fn(rng):
    """ResNet's im2col products alone, on prebuilt column matrices."""
    f32 = np.float32
    convs = [(rng.standard_normal((BATCH * side * side, cin * k * k), f32),
              rng.standard_normal((cin * k * k, cout), f32), grad)
             for cin, cout, k, side, grad in RES_CONVS]
    fc, feats = rng.standard_normal((64, 10), f32), rng.standard_normal((BATCH, 64), f32)

    def step():
        g = feats @ fc
        _ = feats.T @ g
        _ = g @ fc.T
        for cols, w, grad in convs:
            out = cols @ w
            _ = cols.T @ out  # weight gradient
            if grad:
                _ = out @ w.T  # input gradient (columns)
    return step


def floor_fn(rng):
    """The products alone, on prebuilt column matrices."""
    f32 = np.float32
    c1, c2 = rng.standard_normal((BATCH * 28 * 28, 75), f32), rng.standard_normal(
        (BATCH * 10 * 10, 150), f32)
    w1, w2 = rng.standard_normal((75, 6), f32), rng.standard_normal((150, 16), f32)
    fcs = [rng.standard_normal(s, f32) for s in ((400, 120), (120, 84), (84, 10))]
    x3 = rng.standard_normal((BATCH, 400), f32)

    def step():
        o1 = c1 @ w1
        o2 = c2 @ w2
        acts = [x3]
        for w in fcs:
            acts.append(acts[-1] @ w)
        g = acts[-1]
        for i in (2, 1, 0):
            _ = acts[i].T @ g
            g = g @ fcs[i].T
        _ = c2.T @ o2  # conv2 weight gradient
        _ = o2 @ w2.T  # conv2 input gradient (columns)
        _ = c1.T @ o1  # conv1 weight gradient
    return step


def ours_fn(x, y, kernels, net=Net):
    sn.manual_seed(0)
    return build_ours(x, y, kernels, net())


def child(steps):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, BATCH)
    fns = {"floor": floor_fn(rng), "ours": ours_fn(x, y, "numba"), "xp": ours_fn(x, y, "xp"),
           "res_floor": res_floor_fn(rng), "res": ours_fn(x, y, "numba", ResNet)}
    for fn in fns.values():
        fn()  # warm-up: compiles the kernels
    t = median_times(fns, steps)
    print(f"{os.environ['OMP_NUM_THREADS']:>7} {t['floor'] * 1e3:9.2f} {t['ours'] * 1e3:9.2f} "
          f"{t['xp'] * 1e3:9.2f} {t['ours'] / t['floor']:10.2f} {t['xp'] / t['floor']:8.2f} "
          f"{t['res_floor'] * 1e3:9.2f} {t['res'] * 1e3:8.2f} {t['res'] / t['res_floor']:9.2f}",
          flush=True)


def header(steps):
    return (f"CIFAR-10 CNN, batch {BATCH}, 3x32x32, float32, SGD momentum; median of {steps} "
            "interleaved steps (ms); goal ours/floor <= 1.8; res_*: the ResNet-style net\n"
            "threads  floor_ms   ours_ms     xp_ms ours/floor xp/floor res_floor   res_ms "
            "res/floor")


def main():
    return thread_sweep(__file__, __doc__, child, header)


if __name__ == "__main__":
    main()
