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

    python benchmarks/cnn_step.py --layers [--steps 9]

Where the time goes, per convolution shape (1 BLAS thread): every
convolution of the CIFAR-10 net (batch 64) and of ResNet-18 (width 16,
32x32, batch 32: the stem, 3x3 at stride 1 and 2, the 1x1/s2 shortcuts),
forward and backward (weight and input gradients; the stems' inputs need
none) timed apart, each against its floor: its FLOPs (2·N·Ho·Wo·O·C·kh·kw
per product) at this core's measured peak (a 1024^3 float32 GEMM).
Columns: ms, GFLOP/s and ms/floor for forward and backward; count is how
many times the shape occurs in its step.
"""
import os
import sys
import time

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn
from spmdnet.kernels import dispatch
from spmdnet.launch import rerun_with_threads, thread_sweep

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


# (name, count in its step, N, C, O, side, kernel, stride, padding, needs input gradient)
LAYER_SHAPES = (
    ("cifar conv1 5x5", 1, 64, 3, 6, 32, 5, 1, 0, False),
    ("cifar conv2 5x5", 1, 64, 6, 16, 14, 5, 1, 0, True),
    ("resnet stem 3x3", 1, 32, 3, 16, 32, 3, 1, 1, False),
    ("resnet 16 3x3/1", 4, 32, 16, 16, 32, 3, 1, 1, True),
    ("resnet 16-32 3x3/2", 1, 32, 16, 32, 32, 3, 2, 1, True),
    ("resnet 16-32 1x1/2", 1, 32, 16, 32, 32, 1, 2, 0, True),
    ("resnet 32 3x3/1", 3, 32, 32, 32, 16, 3, 1, 1, True),
    ("resnet 32-64 3x3/2", 1, 32, 32, 64, 16, 3, 2, 1, True),
    ("resnet 32-64 1x1/2", 1, 32, 32, 64, 16, 1, 2, 0, True),
    ("resnet 64 3x3/1", 3, 32, 64, 64, 8, 3, 1, 1, True),
    ("resnet 64-128 3x3/2", 1, 32, 64, 128, 8, 3, 2, 1, True),
    ("resnet 64-128 1x1/2", 1, 32, 64, 128, 8, 1, 2, 0, True),
    ("resnet 128 3x3/1", 3, 32, 128, 128, 4, 3, 1, 1, True),
)


def _seconds(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def peak_flops(repeats=5):
    """This core's float32 FLOP/s: the best of a few 1024^3 GEMMs."""
    a = np.random.default_rng(0).standard_normal((1024, 1024), np.float32)
    best = min(_seconds(lambda: a @ a) for _ in range(repeats + 1))
    return 2 * 1024 ** 3 / best


def layer_times(shape, steps, rng):
    """Median forward and backward seconds of one convolution shape, and its
    forward FLOPs."""
    _, _, n, c, o, side, k, stride, pad, input_grad = shape
    x = sn.tensor(rng.standard_normal((n, c, side, side), np.float32), requires_grad=input_grad)
    w = sn.tensor(0.1 * rng.standard_normal((o, c, k, k), np.float32), requires_grad=True)
    out = F.conv2d(x, w, None, stride, pad)
    g = sn.tensor(rng.standard_normal(out.shape, np.float32))
    flops = 2 * out.numel() * c * k * k

    def forward():
        return F.conv2d(x, w, None, stride, pad)

    def forward_backward():
        x.grad = w.grad = None
        forward().backward(g)

    forward_backward()  # warm-up: kernels compiled, buffers allocated
    fwd, both = [], []
    for _ in range(steps):  # interleaved: the machine's noise hits both alike
        fwd.append(_seconds(forward))
        both.append(_seconds(forward_backward))
    fwd_s, both_s = float(np.median(fwd)), float(np.median(both))
    return fwd_s, max(both_s - fwd_s, 1e-9), flops


def conv_path(shape):
    """Which of ops.conv's paths a shape takes: winograd, direct or gemm
    (columns), as kernels.dispatch decides it."""
    _, _, _, c, o, _, k, stride, _, _ = shape
    weight_shape = (o, c, k, k)
    if dispatch.winograd_takes(weight_shape, (stride, stride), (1, 1), 1):
        return "winograd"
    return "direct" if dispatch.conv_direct_takes(weight_shape, (stride, stride)) else "gemm"


def layers_child(steps):
    peak = peak_flops()
    rng = np.random.default_rng(0)
    print(f"per convolution shape, 1 thread, median of {steps}; floor = FLOPs at the "
          f"measured peak {peak / 1e9:.0f} GFLOP/s")
    print(f"{'shape':22s} {'path':>8} {'count':>5} {'fwd_ms':>8} {'GF/s':>6} {'x floor':>7} "
          f"{'bwd_ms':>8} {'GF/s':>6} {'x floor':>7}")
    totals = np.zeros(3)
    for shape in LAYER_SHAPES:
        fwd, bwd, flops = layer_times(shape, steps, rng)
        bwd_flops = flops * (2 if shape[-1] else 1)
        count = shape[1]
        if shape[0].startswith("resnet"):
            totals += count * np.array([fwd, bwd, (flops + bwd_flops) / peak])
        print(f"{shape[0]:22s} {conv_path(shape):>8} {count:5d} {fwd * 1e3:8.2f} "
              f"{flops / fwd / 1e9:6.1f} "
              f"{fwd * peak / flops:7.2f} {bwd * 1e3:8.2f} {bwd_flops / bwd / 1e9:6.1f} "
              f"{bwd * peak / bwd_flops:7.2f}", flush=True)
    print(f"ResNet-18's convolutions in a step: forward {totals[0] * 1e3:.1f} ms, backward "
          f"{totals[1] * 1e3:.1f} ms, their FLOP floor {totals[2] * 1e3:.1f} ms")


def _option(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main():
    if "--layers-child" in sys.argv:
        return layers_child(int(_option("--steps", 9)))
    if "--layers" in sys.argv:  # a fresh process with one BLAS thread
        rerun_with_threads(__file__, [1], "--layers-child", "--steps", _option("--steps", 9))
        return 0
    return thread_sweep(__file__, __doc__, child, header)


if __name__ == "__main__":
    main()
