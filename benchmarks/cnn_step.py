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
and prints median times and ours/floor (issue 15's goal: <= 1.8).
"""
import os

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn, optim
from spmdnet.launch import thread_sweep

from mlp_step import median_times  # benchmarks/ is on the path of a script run

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


def ours_fn(x, y, kernels):
    sn.manual_seed(0)
    model = Net()
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xt = sn.Tensor(x)

    def step():
        with sn.kernels.use(kernels):
            loss = F.cross_entropy(model(xt), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return step


def child(steps):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, BATCH)
    fns = {"floor": floor_fn(rng), "ours": ours_fn(x, y, "numba"), "xp": ours_fn(x, y, "xp")}
    for fn in fns.values():
        fn()  # warm-up: compiles the kernels
    t = median_times(fns, steps)
    print(f"{os.environ['OMP_NUM_THREADS']:>7} {t['floor'] * 1e3:9.2f} {t['ours'] * 1e3:9.2f} "
          f"{t['xp'] * 1e3:9.2f} {t['ours'] / t['floor']:10.2f} {t['xp'] / t['floor']:8.2f}",
          flush=True)


def header(steps):
    return (f"CIFAR-10 CNN, batch {BATCH}, 3x32x32, float32, SGD momentum; median of {steps} "
            "interleaved steps (ms); goal ours/floor <= 1.8\n"
            "threads  floor_ms   ours_ms     xp_ms ours/floor xp/floor")


def main():
    return thread_sweep(__file__, __doc__, child, header)


if __name__ == "__main__":
    main()
