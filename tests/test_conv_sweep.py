"""Every convolution, pooling and batch-norm path over channel counts from
1 to 1024 (powers of two and odd counts) and odd image sizes, float32 and
float64, forward and backward, each against the xp reference path
(``kernels.use("xp")``), each case under its own timeout: no shape may loop.

The channel pairs are picked to hit each rule of ``kernels/dispatch.py``
(Winograd on stride-1 3x3 with at least 16 channels each side, the direct
kernels on one channel per group or up to 6 channels with 9 taps, the
columns' GEMM with col2im otherwise), and each case checks that the path it
names is the one that ran. Batch and images stay tiny (one or two images of
at most 9x9): the sweep is about shapes, not sizes. The full-width ResNet-18
runs at the end: in float32 at batch 1 (it hung in Winograd at 512
channels), and in float64 against PyTorch's output and gradients
(tests/fixtures/torch_files/resnet18_full.pt)."""
import os

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet.ops import conv as conv_op
from tests.helpers.kernel_calls import count_steps
from tests.helpers.resnet18 import ResNet18, seeded_state

# A hang compiled in Numba never returns to Python, where the signal method's
# exception would be raised: the thread method ends the process instead. Each
# case runs in well under a second; the margin is for a first call compiling
# its kernels without the disk cache on a loaded machine.
pytestmark = pytest.mark.timeout(120, method="thread")

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "torch_files")
DTYPES = [np.float32, np.float64]
# |path - xp| / max |xp| per array: float32 Winograd rounds its transforms'
# sums (1e-6 relative at 1024 channels); float64 agrees to rounding
TOLERANCE = {np.float32: 2e-5, np.float64: 1e-12}
CONV_STEPS = ("winograd_forward", "winograd_backward", "direct_forward", "direct_weight_grad",
              "direct_input_grad", "col2im")

# (in channels, out channels, kernel, stride, padding, dilation, groups, image side, path)
CONV_CASES = [
    # Winograd: stride-1 3x3, one group, min(C, O) >= 16; the row sizes 2 KiB
    # multiples (512 float32, 256 float64) hung its buffer padding
    (16, 16, 3, 1, 1, 1, 1, 9, "winograd"),
    (17, 32, 3, 1, 1, 1, 1, 7, "winograd"),
    (64, 255, 3, 1, 0, 1, 1, 5, "winograd"),
    (256, 256, 3, 1, 1, 1, 1, 3, "winograd"),
    (255, 513, 3, 1, 1, 1, 1, 1, "winograd"),
    (512, 512, 3, 1, 1, 1, 1, 3, "winograd"),
    (513, 17, 3, 1, 1, 1, 1, 5, "winograd"),
    (1024, 1024, 3, 1, 1, 1, 1, 1, "winograd"),
    (1023, 128, 3, 1, 1, 1, 1, 3, "winograd"),
    # one side under 16 channels: the direct kernels (<= 15 in) or the columns' GEMM
    (15, 512, 3, 1, 1, 1, 1, 5, "direct"),
    (1024, 8, 3, 1, 1, 1, 1, 3, "gemm"),
    # direct: stride 1 and one input channel per group, or <= 15 channels and >= 9 taps
    (1, 1, 3, 1, 1, 1, 1, 1, "direct"),
    (1, 1024, 3, 1, 1, 1, 1, 5, "direct"),
    (3, 64, 7, 1, 3, 1, 1, 9, "direct"),
    (6, 17, 5, 1, 2, 1, 1, 7, "direct"),
    (8, 8, 3, 1, 1, 1, 1, 9, "direct"),  # ResNet-18 at width 8
    (2, 255, 3, 1, 2, 2, 1, 5, "direct"),
    (512, 512, 3, 1, 1, 1, 512, 5, "direct"),  # depthwise
    (1024, 1024, 3, 1, 1, 1, 1024, 3, "direct"),
    # the columns' GEMM (col2im for the input gradient)
    (16, 24, 5, 1, 2, 1, 1, 7, "gemm"),  # 16 channels: past the direct kernels, 5x5
    (4, 8, 1, 1, 1, 1, 1, 5, "gemm"),  # 1 tap, padded
    (32, 64, 1, 1, 0, 1, 2, 5, "gemm"),  # 1 tap, two groups
    (64, 128, 3, 2, 1, 1, 1, 9, "gemm"),
    (255, 513, 3, 2, 1, 1, 1, 5, "gemm"),
    (512, 1024, 3, 2, 1, 1, 1, 3, "gemm"),
    # 1x1, no padding, one group: a GEMM per image (against the columns' path)
    (4, 8, 1, 1, 0, 1, 1, 5, "pointwise"),
    (256, 512, 1, 2, 0, 1, 1, 7, "pointwise"),  # ResNet's projection shortcut
    (1024, 255, 1, 1, 0, 1, 1, 3, "pointwise"),  # a bottleneck's reduction
    (513, 1024, 1, 3, 0, 1, 1, 7, "pointwise"),
    (3, 64, 7, 2, 3, 1, 1, 9, "gemm"),  # ResNet's stem
    (256, 256, 3, 1, 2, 2, 1, 7, "gemm"),  # dilated
    (32, 64, 3, 1, 1, 1, 2, 5, "gemm"),  # two groups of 16
    (1024, 3, 3, 1, 1, 1, 1, 1, "gemm"),
]


def _case_id(case):
    c, o, k, s, p, d, g, side, path = case
    return f"{c}-{o}-k{k}s{s}p{p}d{d}g{g}-{side}px-{path}"


def _compare(got, want, dtype):
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype == np.dtype(dtype)
        assert a.shape == b.shape
        inf = np.isinf(b)  # a max-pool window wholly in the padding: -inf, as PyTorch
        assert np.array_equal(a[inf], b[inf]) and not np.isinf(a[~inf]).any()
        a, b = a[~inf], b[~inf]
        scale = max(float(np.abs(b).max(initial=0.0)), 1e-30)
        assert np.abs(a - b).max(initial=0.0) <= TOLERANCE[dtype] * scale, \
            (np.abs(a - b).max(), scale)


def _both_paths(fn, arrays, dtype, seed=0):
    """fn's output and the gradients of its inputs under the kernels and under
    the xp reference, for one random output gradient."""
    results, g = [], None
    for mode in ("numba", "xp"):
        with sn.kernels.use(mode):
            ts = [sn.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
            out = fn(*ts)
            if g is None:
                g = np.random.default_rng(seed).standard_normal(out.shape).astype(dtype)
            # a -inf (max-pool window wholly in the padding) takes no gradient
            finite = out.isfinite()
            sn.where(finite, out, 0.0).mul(sn.tensor(g)).sum().backward()
            results.append([out.numpy()] + [t.grad.numpy() for t in ts])
    return results


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES, ids=_case_id)
def test_conv2d_path_equals_xp(monkeypatch, dtype, case):
    c, o, k, stride, pad, dil, groups, side, path = case
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, c, side, side))
    w = rng.standard_normal((o, c // groups, k, k)) / np.sqrt(c // groups * k * k)
    b = rng.standard_normal(o)
    calls = count_steps(monkeypatch, "conv2d", CONV_STEPS)
    conv = lambda x, w, b: F.conv2d(x, w, b, stride, pad, dil, groups)  # noqa: E731
    got, want = _both_paths(conv, (x, w, b), dtype)
    if path == "pointwise":  # both modes take it: its reference is the columns' path
        assert sum(calls.values()) == 0
        with monkeypatch.context() as patch:
            patch.setattr(conv_op, "pointwise_takes", lambda *args: False)
            want = _both_paths(conv, (x, w, b), dtype)[1]
    _compare(got, want, dtype)
    if path == "winograd":
        assert calls["winograd_forward"] == calls["winograd_backward"] == 1
        assert calls["direct_forward"] == calls["col2im"] == 0
    elif path == "direct":
        assert calls["direct_forward"] == calls["direct_weight_grad"] == 1
        assert calls["direct_input_grad"] == 1
        assert calls["winograd_forward"] == 0 and calls["col2im"] == 0
    elif path == "gemm":
        assert calls["winograd_forward"] == calls["direct_forward"] == 0
        assert calls["col2im"] == 1


# (in channels, out channels, kernel, stride, padding, image side): col2im is the forward
TRANSPOSE_CASES = [(1, 1, 3, 1, 0, 1), (3, 1024, 2, 2, 0, 3), (512, 256, 3, 2, 1, 5),
                   (1023, 17, 4, 2, 1, 1), (256, 513, 3, 1, 1, 7)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TRANSPOSE_CASES)
def test_conv_transpose2d_col2im_equals_xp(monkeypatch, dtype, case):
    c, o, k, stride, pad, side = case
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, c, side, side))
    w = rng.standard_normal((c, o, k, k)) / np.sqrt(c * k * k)
    calls = count_steps(monkeypatch, "conv2d", ("col2im",))
    got, want = _both_paths(lambda x, w: F.conv_transpose2d(x, w, stride=stride, padding=pad),
                            (x, w), dtype)
    _compare(got, want, dtype)
    assert calls["col2im"] >= 1


POOL_CHANNELS = [1, 3, 16, 17, 255, 512, 513, 1024]
SIDES = [1, 3, 5, 7, 9]
# each channel count with one odd side (cycling), and the widest with the largest
POOL_SHAPES = [(c, SIDES[i % len(SIDES)]) for i, c in enumerate(POOL_CHANNELS)] + [(1023, 9)]
POOLS = {  # name: (kind, kernel, stride, padding, dilation, ceil_mode, count_include_pad)
    "max3s2p1": ("max", 3, 2, 1, 1, False, True),
    "max2s2ceil": ("max", 2, 2, 0, 1, True, True),
    "max2s1p1dil2": ("max", 2, 1, 1, 2, False, True),
    "avg3s1p1": ("avg", 3, 1, 1, 1, False, True),
    "avg2s2ceil": ("avg", 2, 2, 0, 1, True, False),
    "adaptive_avg1": ("adaptive_avg", (1, 1)),
    "adaptive_avg3x2": ("adaptive_avg", (3, 2)),
    "adaptive_max2": ("adaptive_max", (2, 2)),
}


def _pool(spec):
    kind = spec[0]
    if kind.startswith("adaptive"):
        fn = F.adaptive_avg_pool2d if kind == "adaptive_avg" else F.adaptive_max_pool2d
        return lambda x: fn(x, spec[1])
    k, s, p, d, ceil, include = spec[1:]
    if kind == "max":
        return lambda x: F.max_pool2d(x, k, s, p, dilation=d, ceil_mode=ceil)
    return lambda x: F.avg_pool2d(x, k, s, p, ceil_mode=ceil, count_include_pad=include)


def _windows(size, spec):
    """[(first, stop, step, divisor size)] of each output position along one side:
    the definition, written out."""
    if spec[0].startswith("adaptive"):
        out = spec[1]
        return [[(i * size // o, -(-(i + 1) * size // o), 1, None) for i in range(o)]
                for o in out]
    k, s, p, d, ceil, include = spec[1:]
    span = d * (k - 1) + 1
    count = (size + 2 * p - span + (s - 1 if ceil else 0)) // s + 1
    if ceil and (count - 1) * s >= size + p:
        count -= 1
    sides = []
    for i in range(count):
        start = i * s - p
        taps = [start + t * d for t in range(k) if 0 <= start + t * d < size]
        padded = min(start + span, size + p) - start if include else len(taps)
        # a window wholly in the padding (dilation allows it) takes nothing
        sides.append((taps[0], taps[-1] + 1, d, padded) if taps else (0, 0, 1, padded))
    return [sides, sides]


def _pool_loops(x, spec):
    rows, cols = _windows(x.shape[2], spec)
    out = np.empty(x.shape[:2] + (len(rows), len(cols)))
    for i, (r0, r1, rs, rdiv) in enumerate(rows):
        for j, (c0, c1, cs, cdiv) in enumerate(cols):
            win = x[:, :, r0:r1:rs, c0:c1:cs]
            if "max" in spec[0]:
                out[:, :, i, j] = win.max(axis=(2, 3), initial=-np.inf)
            else:
                div = win.shape[2] * win.shape[3] if rdiv is None else rdiv * cdiv
                out[:, :, i, j] = win.sum(axis=(2, 3)) / div
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", POOL_SHAPES, ids=lambda s: f"{s[0]}ch-{s[1]}px")
@pytest.mark.parametrize("name", list(POOLS))
def test_pooling_equals_xp_and_loops(monkeypatch, dtype, shape, name):
    """Each pooling (the max-pool kernel where dispatch gives it) against the
    xp path and a loop over the windows; and its gradient against the
    identity <dx, x> = <g, out> (every pooling is positively homogeneous)."""
    c, side = shape
    spec = POOLS[name]
    x = np.random.default_rng(3).standard_normal((2, c, side, side))
    calls = count_steps(monkeypatch, "max_pool2d", ("forward",))
    got, want = _both_paths(_pool(spec), (x,), dtype)
    _compare(got, want, dtype)
    _compare([got[0]], [_pool_loops(x.astype(dtype), spec).astype(dtype)], dtype)
    g = np.random.default_rng(0).standard_normal(got[0].shape).astype(dtype)
    out = np.where(np.isfinite(got[0]), got[0], 0)  # -inf: a window that took nothing
    assert np.isclose(np.vdot(got[1], x.astype(dtype)), np.vdot(g, out),
                      rtol=TOLERANCE[dtype] * 10, atol=TOLERANCE[dtype] * np.abs(g).sum())
    assert calls["forward"] == (1 if spec[0] == "max" else 0)


BN_SHAPES = [(c, SIDES[i % len(SIDES)]) for i, c in enumerate(
    [1, 2, 3, 16, 17, 64, 255, 256, 512, 513, 1023, 1024])]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BN_SHAPES, ids=lambda s: f"{s[0]}ch-{s[1]}px")
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_equals_xp(monkeypatch, dtype, shape, training):
    c, side = shape
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, c, side, side)) * 3 + 1
    weight, bias = rng.standard_normal(c), rng.standard_normal(c)
    stats = rng.standard_normal(c), rng.uniform(0.5, 2.0, c)
    calls = count_steps(monkeypatch, "batch_norm", ("moments", "forward"))
    running = []

    def bn(x, w, b):
        mean, var = (sn.tensor(s.astype(dtype)) for s in stats)
        running.append((mean, var))
        return F.batch_norm(x, mean, var, w, b, training=training, momentum=0.1, eps=1e-5)

    got, want = _both_paths(bn, (x, weight, bias), dtype)
    _compare(got, want, dtype)
    _compare([t.numpy() for t in running[0]], [t.numpy() for t in running[1]], dtype)
    # runs of one value per (sample, channel) stay on the xp path (dispatch.batch_takes)
    assert (calls["forward"] > 0) == (side > 1)
    assert (calls["moments"] > 0) == (side > 1 and training)


def _resnet(dtype):
    sn.manual_seed(0)
    model = ResNet18().to(dtype)
    model.load_state_dict(seeded_state(model))
    return model


def test_full_width_resnet18_float32_batch1_completes():
    """One forward and backward of torchvision's ResNet-18 at full width
    (its 512-channel layers took Winograd and never returned): the loss's
    gradients reach every parameter, finite, and the float32 output is
    within float32 rounding of the xp path's."""
    x = np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32)
    outs = {}
    for mode in ("numba", "xp"):
        with sn.kernels.use(mode):
            model = _resnet(np.float32).eval()
            y = model(sn.tensor(x))
            y.square().mean().backward()
            outs[mode] = y.numpy()
            for name, p in model.named_parameters():
                assert p.grad is not None and np.isfinite(p.grad.numpy()).all(), name
    assert outs["numba"].shape == (1, 1000)
    _compare([outs["numba"]], [outs["xp"]], np.float32)


def test_full_width_resnet18_float64_equals_pytorch():
    """Train-mode forward and backward at batch 2 (32x32, float64) against
    PyTorch's on the same seeded weights: output, the input's gradient,
    every parameter's gradient (strided samples of the large ones) and the
    updated BatchNorm running statistics, to 1e-8 of each array's largest value."""
    ref = sn.load(os.path.join(FIXTURES, "resnet18_full.pt"))
    model = _resnet(np.float64).train()
    assert list(ref["names"]) == [n for n in model.state_dict()
                                  if not n.endswith("num_batches_tracked")]
    x = sn.tensor(ref["x"].numpy(), requires_grad=True)
    y = model(x)
    (y * ref["g"]).sum().backward()
    _close(y.detach().numpy(), ref["y"].numpy(), "y")
    _close(x.grad.numpy(), ref["x_grad"].numpy(), "x.grad")
    for name, p in model.named_parameters():
        _close(p.grad.numpy().ravel()[::ref["stride"]], ref["grads"][name].numpy(), name)
    state = model.state_dict()
    for name, want in ref["running"].items():
        _close(state[name].numpy(), want.numpy(), name)


def _close(got, want, name):
    """Within 1e-8 of the array's largest value: batch 2 leaves the last
    stage's BatchNorm two values per channel to normalise, which amplifies
    float64 rounding: 1.3e-10 of the largest value with one BLAS thread, and
    1.0e-9 (a BatchNorm weight's gradient) when OpenBLAS runs several threads
    and so sums in another order."""
    assert got.shape == want.shape, name
    assert np.abs(got - want).max() <= 1e-8 * np.abs(want).max(), name
