"""Where the ops run kernels: one table, one switch.

An op asks ``kernels.lookup(op, *arrays, step=...)`` and gets the kernel to
call, or None: then it runs its own plain-xp code. ``TABLE`` below is all
the policy: which ops and steps have kernels, and on which arrays beyond
those that a kernel takes at all (NumPy float32/float64:
``_target.array_target``; CuPy arrays take CuPy's own code). A row is there
where benchmarks/kernels.py measured the kernel at least 2x faster than the
xp code it replaces (float32, 256x1024; DESIGN.md principle 8), and every
compiled kernel is reachable from a row (tests/test_kernels_dispatch.py).

The switch: ``SPMDNET_KERNELS`` (``numba``, the default, or ``xp``), read
once, at the first lookup; ``with kernels.use("xp"): ...`` changes it for a
block (process-wide, not per thread). An op decides at its forward, for its
backward too (``step="backward"``, asked with forward's arrays), so what it
saved always fits what its backward runs.
"""
import contextlib
from functools import partial
from collections.abc import Callable
from typing import NamedTuple

from .. import config
from . import activation, conv, conv_direct, embedding, loss, norm, optim_kernels
from . import pool, rnn_cell, winograd
from . import softmax
from ._numba import available
from ._target import array_target

# "numba": the kernels TABLE lists, on NumPy arrays; "xp": none.
MODES = ("numba", "xp")

# Logits of up to this many elements: forward and backward together measured
# at least 2x faster (256x10: 2.4x). Larger logits make the forward
# exp-bound, and NumPy's AVX-512 exp loop outruns special.exp (LLVM
# vectorises 8 wide): the pair then gains only 1.4-1.7x (1.5x at 256x32000).
CROSS_ENTROPY_MAX_SIZE = 1 << 14


def _always(*arrays):
    return True


def _small_logits(logits, *arrays):
    return 0 < logits.size <= CROSS_ENTROPY_MAX_SIZE


def _has_last_axis(x, *arrays):
    return x.ndim > 0


def _contiguous(*arrays):
    return all(a.flags.c_contiguous for a in arrays if a is not None)


class Rule(NamedTuple):
    """An op's kernels by step, and the condition on the arrays (beyond
    ``array_target``) under which the op takes them."""
    kernels: dict
    when: Callable = _always


def _activation(name):  # the activation ops: no bias, the input untouched
    return {"forward": partial(activation.forward, activation=name),
            "backward": partial(activation.backward, activation=name)}


def _fused(name, steps=("forward", "backward")):
    """ops.linalg.LinearAct: bias and activation in one pass, in place over
    the product's output; backward gives the bias gradient in the same pass."""
    kernels = {"forward": partial(activation.forward, activation=name, inplace=True),
               "backward": partial(activation.backward, activation=name)}
    return {step: kernels[step] for step in steps}


# Every op that asks, with its kernels. No kernel: tanh's forward is one
# NumPy pass already; its backward and sigmoid's without a bias are
# memory-bound passes that gain 1.4-2x; tanh and sigmoid forward use tanh or
# exp, which NumPy's AVX-512 loops compute faster than special.py, so they have
# no kernel (a kernel no row reaches would be dead code). relu: NumPy
# 2.4's maximum and g * (y > 0) measured 3-4x and 2.4-3x slower than the
# kernels on ResNet-18's activations (b32, 16x32x32 to 128x4x4, 1 thread:
# forward 0.165 against 0.043 ms, backward 0.126 against 0.052 at 16x32x32).
TABLE = {
    "relu": Rule(_activation("relu")),
    "tanh": Rule({}),
    "sigmoid": Rule({}),
    "gelu": Rule(_activation("gelu")),
    "gelu_tanh": Rule(_activation("gelu_tanh")),
    "linear_relu": Rule(_fused("relu")),
    "linear_gelu": Rule(_fused("gelu")),
    "linear_gelu_tanh": Rule(_fused("gelu_tanh")),
    "linear_tanh": Rule({}),
    "linear_sigmoid": Rule(_fused("sigmoid", steps=("backward",))),
    "cross_entropy": Rule({"forward": partial(loss.forward, check=False),
                           "backward": loss.backward}, _small_logits),
    "softmax": Rule({"forward": softmax.forward, "backward": softmax.backward,
                     "forward_lse": softmax.forward_lse, "from_lse": softmax.from_lse},
                    _has_last_axis),
    "layer_norm": Rule({"forward": norm.forward, "backward": norm.backward}, _has_last_axis),
    # ResNet-18's BatchNorm2d shapes (b32, 16x32x32 to 128x4x4), 1 thread, training
    # forward + backward: 1.8-2.8x faster than the xp code (13 against 34 ms of a step);
    # (N, C) input (runs of 1 value) 1-2x slower: xp there (norm.batch_takes)
    "batch_norm": Rule({"moments": norm.batch_moments, "forward": norm.batch_normalize,
                        "sums": norm.batch_grad_sums, "backward": norm.batch_input_grad,
                        "fused_backward": norm.batch_backward},
                       norm.batch_takes),
    "embedding": Rule({"backward": embedding.backward}),
    # attention has no kernel: row-at-a-time kernels (no BLAS) measure 1.2x (T=64)
    # to 11x (T=1024) slower than the op's row-blocked xp path (benchmarks/attention.py);
    # the op asks only for softmax rows (its CPU dropout mask is PyTorch's MT19937
    # draws, so no compiled Philox factors)
    # benchmarks/cnn_step.py shapes, 1 thread: col2im of (C, kh, kw, N, Ho, Wo) columns,
    # a channel of a run of images at a time, 1.3 against 7.3-8.5 ms on ResNet's
    # 16-channel layer (the input gradient of Conv2d and the forward of
    # ConvTranspose2d); max pooling 0.2-0.3
    # against 4.1 ms (pool1). No im2col kernel: one measured 2-4x slower than
    # NumPy's copy of the strided view there, so the op copies the view.
    # Direct stride-1 kernels (kernels/conv_direct.py, no columns) on few input
    # channels per group, where conv_direct_takes says so (1 thread, CPU time):
    # CIFAR conv1 (3->6 5x5, b64) forward 1.2-1.3 against 4.8-5.5 ms (columns +
    # GEMM), weight gradient 1.1-1.3 ms; depthwise 3x3 (32 channels, 16x16, b32)
    # 0.38 + 0.42-0.47 against 2.50 + 0.34 ms. Winograd (kernels/winograd.py,
    # winograd_takes): ResNet-18's stride-1 3x3 layers forward + backward, b32, 16
    # channels at 32x32 10.4 against 20-22 ms on the columns' GEMM; 32 at 16x16 8.9
    # against 12.7-13.6 (best of 11, the machine shared).
    "conv2d": Rule({"col2im": conv.col2im, "channels_last": conv.channels_last,
                    "direct_forward": conv_direct.forward,
                    "direct_weight_grad": conv_direct.weight_grad,
                    "direct_input_grad": conv_direct.input_grad,
                    "winograd_forward": winograd.forward,
                    "winograd_backward": winograd.backward}),
    "max_pool2d": Rule({"forward": pool.max_pool_forward}),
    # nn.LSTM's recurrence in float32, one kernel per step (rnn_cell.takes): per step
    # (N 20, H 200) the pointwise part forward 5.5 against NumPy's 20 us, backward 2.4-3.6
    # against 9 (1 thread); float64 runs the xp code (NumPy's tanh)
    "lstm": Rule({"forward": rnn_cell.forward, "backward": rnn_cell.backward}, rnn_cell.takes),
    "sgd": Rule({"update": optim_kernels.sgd_update}, _contiguous),
    "adam": Rule({"update": optim_kernels.adam_update}, _contiguous),
}

# The direct convolution's shapes: stride 1 and one input channel per group
# (depthwise, single-channel images: the GEMM's K is kh·kw), or up to this
# many channels with at least this many taps. Measured with the two-channel,
# reassociated kernels (1 thread, F.conv2d forward + backward, direct and
# GEMM paths interleaved in one process, 4 runs on a shared machine): CIFAR
# conv1 (3->6 5x5, b64) 3.2-4.2 against 10.2-17.0 ms; its conv2 (6->16 5x5 on
# 14x14, the input gradient on the GEMM path either way) 3.8-5.9 against
# 4.1-6.3 ms, faster in every run by 0.1-0.8 ms; the ResNet stem (3->16 3x3
# pad 1, b32) 2.1-3.7 against 3.5-5.4 ms; 4->8 3x3 (32x32, b32) 2.8-3.9
# against 3.6-4.5 ms; 6->16 3x3 (14x14, b64) even, 2.7-4.2 against 3.0-4.1 ms
# (the bound then). 16-channel 3x3 layers take Winograd (winograd_takes) first.
# Raised from 6 to 15 once the kernels did 4 output channels per pass: every
# shape measured from 7 to 15 channels ran faster direct (forward + backward,
# 1 thread, CPU time, min of 25 after a 64 MiB pass evicts the caches, columns
# as rows): b32 8->8 3x3 at 32x32 1.42 against 3.56 ms, 10->10 2.27 against
# 5.41, 15->15 4.51 against 9.72, 12->12 (b8, 64x64) 2.64 against 5.73, 8->64
# 10.4 against 11.5, 7->24 3.77 against 5.89, 12->32 at 16x16 2.06 against
# 2.14, 8->16 5x5 (b64, 28x28) 8.97 against 12.0; at 16-32 channels (5x5 and
# dilated 3x3, outside Winograd) the two were even or the columns won (16->32
# 5x5 4.67 against 5.53). ResNet-18 at width 8 (its 8-channel layers).
CONV_DIRECT_MAX_CHANNELS = 15
CONV_DIRECT_MIN_TAPS = 9


# kernels/conv.py's channels-last pass writes each padded image row from its C
# plane rows, and pays where those rows are long: b32, 1 thread, CPU time,
# against NumPy's transposing copy (ops.conv_columns.channels_last_padded):
# 16 channels at 32x32 0.24 against 0.31 ms, 3 at 32x32 0.07 against 0.10; at
# 16x16 and below NumPy's is as fast or faster (32 channels 0.13 against 0.10,
# 64 at 8x8 0.075 against 0.043).
CHANNELS_LAST_MIN_WIDTH = 32


def channels_last_takes(x_shape):
    """True when the columns' channels-last copy of an (N, C, H, W) input
    should run the compiled pass (the op still asks ``lookup`` for it)."""
    return x_shape[3] >= CHANNELS_LAST_MIN_WIDTH


def conv_direct_takes(weight_shape, stride):
    """True when conv2d should run the direct kernels for this weight (O,
    C/G, kh, kw) and stride (the op still asks ``lookup`` for them)."""
    _, channels, kh, kw = weight_shape
    if tuple(stride) != (1, 1):
        return False
    return channels == 1 or (channels <= CONV_DIRECT_MAX_CHANNELS
                             and kh * kw >= CONV_DIRECT_MIN_TAPS)


# The direct path's input gradient (conv_direct.input_grad: the forward kernel
# over the output gradient padded by d·(k-1) - pad, the flipped weights) where
# that padding is at most the forward's (no more taps than the forward), or
# the GEMM would be thin (at most this many output channels per group: its
# inner size). 1 thread, against the GEMM and col2im: depthwise 3x3 (32
# channels, 16x16, b32) 0.22 against 4.1 ms; CIFAR conv1 (3->6 5x5, b64) 0.68
# against 4.8; the ResNet stem 0.46 against 0.68-0.98; 8->8 3x3 (32x32, b32)
# 0.39-0.41 against 2.6-3.0. CIFAR conv2 (6->16 5x5, 14x14, no padding: the
# full correlation has twice the forward's taps) 0.70-0.89 against 0.59-0.64:
# the GEMM.
CONV_DIRECT_INPUT_MAX_OUT_CHANNELS = 8


def conv_direct_input_takes(weight_shape, pads, dilation, groups):
    """True when a convolution on the direct path (``conv_direct_takes``)
    should take the direct input gradient too (else the GEMM and col2im)."""
    out_channels, _, kh, kw = weight_shape
    if out_channels // groups <= CONV_DIRECT_INPUT_MAX_OUT_CHANNELS:
        return True
    return all(d * (k - 1) - before <= before
               for (before, _), k, d in zip(pads, (kh, kw), dilation))


# Winograd F(2x2, 3x3) (kernels/winograd.py) for stride-1, undilated, ungrouped
# 3x3 convolutions with at least this many input and output channels (the
# GEMMs' inner size): ResNet's 3x3 layers. Fewer channels leave the 16 GEMMs
# too thin for BLAS, and the stems to the columns or the direct kernel.
WINOGRAD_MIN_CHANNELS = 16


def winograd_takes(weight_shape, stride, dilation, groups):
    """True when conv2d should run Winograd for this weight (O, C/G, kh, kw)."""
    out_channels, channels, kh, kw = weight_shape
    return ((kh, kw) == (3, 3) and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1)
            and groups == 1 and min(out_channels, channels) >= WINOGRAD_MIN_CHANNELS)


_mode = []  # [mode] once SPMDNET_KERNELS has been read


def mode():
    """``"numba"`` or ``"xp"``: the setting (``SPMDNET_KERNELS`` at first
    use, or the innermost ``use()``)."""
    if not _mode:
        _mode.append(config.get_choice("SPMDNET_KERNELS", set(MODES), "numba"))
    return _mode[0]


def enabled():
    """True when the ops may take kernels: mode ``numba`` and Numba imports
    (one warning when it does not)."""
    return mode() != "xp" and available()


@contextlib.contextmanager
def use(new_mode):
    """``with kernels.use("xp"):`` runs the block on the plain-xp paths
    (``"numba"``: with kernels); the previous setting returns after it."""
    if new_mode not in MODES:
        raise ValueError(f"kernels.use: mode must be one of {MODES}, got {new_mode!r}")
    previous = mode()
    _mode[0] = new_mode
    try:
        yield
    finally:
        _mode[0] = previous


def lookup(op, *arrays, step="forward"):
    """The kernel that runs ``step`` of ``op`` on these arrays, or None
    (then the op runs its xp code). ``op`` must be a row of ``TABLE``;
    ``None`` entries among the arrays are skipped."""
    rule = TABLE[op]
    kernel = rule.kernels.get(step)
    if kernel is None or not enabled():
        return None
    if array_target(*arrays) is None or not rule.when(*arrays):
        return None
    return kernel
