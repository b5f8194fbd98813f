"""Training-step speed of the full-width CIFAR ResNet-18 against its GEMM and FLOP floors.

    python benchmarks/resnet18_full_step.py [--steps 5] [--threads 1] [--width 64]

ResNet-18 for 32x32 images at full width (64-128-256-512 channels: 3x3
stem, no max-pool, BasicBlocks with BatchNorm2d and 1x1/s2 projection
shortcuts, adaptive average pool, Linear(512, 10)), batch 32, float32,
SGD with momentum and weight decay, cross-entropy: the peer's
``step.py resnet18`` model at width 64. In a fresh process per BLAS thread
count it times, interleaved:
  ours   a spmdnet step: model(x), F.cross_entropy, backward, opt.step()
  gemm   the matrix products of an im2col formulation of the same step:
         every convolution's forward, weight-gradient and input-gradient
         GEMMs (the stem's input gradient excepted) and the Linear's, on
         column matrices built before timing
and prints the medians, ours/gemm, and ours/flop: the step against its
convolutions' and Linear's FLOPs (2 per multiply-add, three products each)
at this core's measured float32 peak (the best 1024^3 GEMM). Winograd
(stride-1 3x3 layers) does 2.25x fewer multiply-adds than the GEMMs, so
ours/gemm can go below 1. Its every 512-channel layer hung in Winograd's
buffer padding before; the step at full width is the measure of record for
the big layers (benchmarks/cnn_step.py stops at 128 channels). ``--width W``:
the same network with W-2W-4W-8W channels (the peer's ``step.py resnet18``
is width 16; below 16 channels the direct kernels take the 3x3 layers).
"""
import os
import time

import numpy as np

import spmdnet as sn
from spmdnet import nn
from spmdnet import optim
from spmdnet.launch import thread_sweep
from spmdnet.nn import functional as F

BATCH = 32


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def stage_widths(width):
    """The four stages' channels: width, 2·width, 4·width, 8·width."""
    return tuple(width * 2 ** i for i in range(4))


class ResNet18(nn.Module):
    def __init__(self, widths):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        blocks, cin = [], widths[0]
        for i, cout in enumerate(widths):
            blocks += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*blocks)
        self.linear = nn.Linear(cin, 10)

    def forward(self, x):
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))


def conv_shapes(widths):
    """(cin, cout, kernel, output side, needs input gradient) of every
    convolution of the step, in order."""
    shapes, side, cin = [(3, widths[0], 3, 32, False)], 32, widths[0]
    for i, cout in enumerate(widths):
        stride = 1 if i == 0 else 2
        side //= stride
        shapes.append((cin, cout, 3, side, True))
        if stride != 1 or cin != cout:
            shapes.append((cin, cout, 1, side, True))
        shapes += [(cout, cout, 3, side, True)] * 3
        cin = cout
    return shapes


def step_flops(widths):
    """Multiply-adds x 2 of the convolutions' and the Linear's forward,
    weight-gradient and input-gradient products."""
    total = 0
    for cin, cout, k, side, grad in conv_shapes(widths):
        total += 2 * BATCH * side * side * cin * cout * k * k * (3 if grad else 2)
    return total + 2 * BATCH * widths[-1] * 10 * 3


def gemm_fn(rng, widths):
    """The im2col products alone: one column matrix per distinct shape (the
    repeats reuse it), built before timing."""
    f32 = np.float32
    cols = {}
    work = []
    for cin, cout, k, side, grad in conv_shapes(widths):
        key = (cin, k, side)
        if key not in cols:
            cols[key] = rng.standard_normal((BATCH * side * side, cin * k * k), f32)
        work.append((cols[key], rng.standard_normal((cin * k * k, cout), f32), grad))
    feats, fc = rng.standard_normal((BATCH, widths[-1]), f32), rng.standard_normal(
        (widths[-1], 10), f32)

    def step():
        g = feats @ fc
        _ = feats.T @ g
        _ = g @ fc.T
        for c, w, grad in work:
            out = c @ w
            _ = c.T @ out  # weight gradient
            if grad:
                _ = out @ w.T  # input gradient (columns)
    return step


def ours_fn(x, y, widths):
    sn.manual_seed(0)
    model = ResNet18(widths)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    xt = sn.tensor(x)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(xt), y).backward()
        opt.step()
    return step


def peak_flops(repeats=5):
    """This core's float32 FLOP/s: the best of a few 1024^3 GEMMs."""
    a = np.random.default_rng(0).standard_normal((1024, 1024), np.float32)
    best = float("inf")
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        _ = a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * 1024 ** 3 / best


def child(steps, width):
    widths = stage_widths(width)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32)
    y = sn.tensor(rng.integers(0, 10, BATCH))
    fns = {"ours": ours_fn(x, y, widths), "gemm": gemm_fn(rng, widths)}
    for fn in fns.values():
        fn()  # warm-up: kernels compiled, buffers and momentum allocated
    times = {name: [] for name in fns}
    for _ in range(steps):
        for name, fn in fns.items():  # interleaved: the machine's noise hits both alike
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    t = {name: float(np.median(ts)) for name, ts in times.items()}
    flop = step_flops(widths) / peak_flops()
    print(f"{os.environ.get('OMP_NUM_THREADS', '?'):>7} {t['ours'] * 1e3:9.1f} "
          f"{t['gemm'] * 1e3:9.1f} {flop * 1e3:9.1f} {t['ours'] / t['gemm']:9.2f} "
          f"{t['ours'] / flop:9.2f}", flush=True)


def header(steps, width):
    return (f"CIFAR ResNet-18 at width {width} ({'-'.join(map(str, stage_widths(width)))} "
            f"channels), batch {BATCH}, 3x32x32, float32, SGD momentum; "
            f"median of {steps} interleaved steps (ms)\n"
            "threads   ours_ms   gemm_ms   flop_ms ours/gemm ours/flop")


def main():
    return thread_sweep(__file__, __doc__, child, header, steps=5,
                        options={"--width": (int, 64, "the first stage's channels")})


if __name__ == "__main__":
    main()
