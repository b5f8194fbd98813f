"""The seam between ops and kernels: ``kernels.lookup``, its table and switch.

The table alone decides which op takes a kernel; ``kernels.use`` switches
for a block; the ``SPMDNET_KERNELS`` knob is read once; with kernels off no
Numba code runs; an op decides at forward for its backward, so switching
between the two gives the right gradient; every compiled kernel is reached
from a table row (no dead kernels); CuPy arrays take no kernel. Also the
fused linear layer against the unfused ops.
"""
import importlib
import pkgutil

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import kernels, nn, optim
from spmdnet.autograd import gradcheck
from spmdnet.autograd.grad_placement import place_grad
from spmdnet.kernels import _cpu, _numba, dispatch, loss, norm
from spmdnet.ops import batchnorm
from spmdnet.ops.nn_ops import LayerNorm

ACTS = list(F.ACTIVATIONS)
PLAIN_PYTHON = _numba.jit_disabled()


# -- the fused linear layer ----------------------------------------------------------------
def _ops_inputs(seed=0, shape=(6, 5)):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), rng.standard_normal((4, shape[-1])), \
        rng.standard_normal(4)


@pytest.mark.parametrize("name", ACTS)
@pytest.mark.parametrize("shape", [(6, 5), (2, 3, 5)])
def test_fused_linear_equals_unfused_ops(float64, name, shape):
    x, w, b = _ops_inputs(1, shape)
    unfused = {"relu": F.relu, "tanh": F.tanh, "sigmoid": F.sigmoid, "gelu": F.gelu,
               "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[name]
    results = []
    for fused in (True, False):
        ts = [sn.tensor(a, requires_grad=True) for a in (x, w, b)]
        out = F.linear(*ts, activation=name) if fused else unfused(F.linear(*ts))
        (out * out).sum().backward()
        results.append([out.numpy()] + [t.grad for t in ts])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.skipif(PLAIN_PYTHON, reason="finite differences: slow, and run already")
@pytest.mark.parametrize("name", ACTS)
def test_fused_linear_gradcheck(float64, name):
    x, w, b = _ops_inputs(2)
    gradcheck(lambda *t: F.linear(*t, activation=name), x, w, b)
    gradcheck(lambda *t: F.linear(*t, activation=name), x, w)


def test_fused_linear_bias_gradient_goes_into_its_grad_placement(float64):
    x, w, b = _ops_inputs(3)
    wt, bt = sn.tensor(w, requires_grad=True), sn.tensor(b, requires_grad=True)
    buf = np.zeros(4)
    home = sn.Tensor(buf)  # a Tensor over the preallocated array
    place_grad(bt, home)
    F.linear(sn.tensor(x), wt, bt, activation="gelu").sum().backward()
    assert bt.grad is home and bt.grad.array is buf and np.abs(buf).sum() > 0


def test_sequential_fuses_linear_and_activation(float64):
    model = nn.Sequential(nn.Linear(5, 4), nn.GELU(approximate="tanh"), nn.Linear(4, 3),
                          nn.ReLU(), nn.Linear(3, 2), nn.Tanh())
    x = sn.tensor(_ops_inputs(4)[0])
    out = model(x)
    assert type(out._ctx).__name__ == "LinearAct" and out._ctx.activation == "tanh"
    manual = x
    for m in model:
        manual = m(manual)
    np.testing.assert_allclose(out.numpy(), manual.numpy(), rtol=1e-12)


def test_linear_rejects_unknown_activation():
    x, w, b = (sn.tensor(a) for a in _ops_inputs())
    with pytest.raises(ValueError, match="activation must be None or one of"):
        F.linear(x, w, b, activation="elu")


# -- the table and the switch ----------------------------------------------------------------
def test_table_decides_which_ops_take_kernels():
    x32, x16 = np.ones((4, 3), np.float32), np.ones((4, 3), np.float16)
    assert kernels.lookup("gelu", x32) is not None
    assert kernels.lookup("tanh", x32) is None  # a row without kernels
    assert kernels.lookup("linear_sigmoid", x32) is None  # backward only
    assert kernels.lookup("linear_sigmoid", x32, step="backward") is not None
    assert kernels.lookup("gelu", x16) is None  # arrays no kernel takes
    assert kernels.lookup("gelu", x32, x32.astype(np.float64)) is None
    limit = dispatch.CROSS_ENTROPY_MAX_SIZE
    assert kernels.lookup("cross_entropy", np.ones((1, limit), np.float32)) is not None
    assert kernels.lookup("cross_entropy", np.ones((1, limit + 1), np.float32)) is None
    assert kernels.lookup("cross_entropy", np.ones((0, 3), np.float32)) is None
    assert kernels.lookup("sgd", x32, x32.T, step="update") is None  # not contiguous
    with pytest.raises(KeyError):
        kernels.lookup("no_such_op", x32)


def test_cupy_arrays_take_no_kernel():
    """The numba.cuda twins were removed (2x slower than CuPy's own code on an
    H100): a CuPy array, alone or beside NumPy ones, gets no kernel."""
    cp = pytest.importorskip("cupy")
    try:
        x = cp.ones((4, 3), cp.float32)
    except Exception as exc:  # CuPy installed without a usable device
        pytest.skip(f"no CUDA device: {exc!r}")
    assert kernels.lookup("gelu", x) is None
    assert kernels.lookup("layer_norm", np.ones((4, 3), np.float32), x) is None


def test_a_table_row_is_what_the_op_runs(monkeypatch):
    calls = []

    def fake_relu(a):
        calls.append(a.shape)
        return np.maximum(a, 0) * 2, a > 0

    monkeypatch.setitem(dispatch.TABLE, "relu", dispatch.Rule({"forward": fake_relu}))
    monkeypatch.setitem(dispatch.TABLE, "gelu", dispatch.Rule({}))
    x = sn.tensor(np.array([[-1.0, 2.0]], np.float32))
    np.testing.assert_array_equal(F.relu(x).numpy(), [[0.0, 4.0]])
    F.gelu(x)  # no row: the xp path, no kernel
    assert calls == [(1, 2)]


def test_use_switches_for_a_block_and_restores():
    assert kernels.mode() == "numba"
    with kernels.use("xp"):
        assert kernels.mode() == "xp" and not kernels.enabled()
        assert kernels.lookup("gelu", np.ones(3, np.float32)) is None
        with kernels.use("numba"):
            assert kernels.enabled()
        assert kernels.mode() == "xp"
    with pytest.raises(RuntimeError), kernels.use("xp"):
        raise RuntimeError("the setting comes back anyway")
    assert kernels.mode() == "numba"
    with pytest.raises(ValueError, match="mode must be one of"), kernels.use("cuda"):
        pass


def test_knob_is_read_once(monkeypatch):
    monkeypatch.setattr(dispatch, "_mode", [])
    monkeypatch.setenv("SPMDNET_KERNELS", "xp")
    assert kernels.mode() == "xp"
    monkeypatch.setenv("SPMDNET_KERNELS", "numba")
    assert kernels.mode() == "xp"  # read once: the first lookup decided
    monkeypatch.setattr(dispatch, "_mode", [])
    monkeypatch.setenv("SPMDNET_KERNELS", "numba-cuda")  # the removed CUDA mode
    with pytest.raises(ValueError, match="SPMDNET_KERNELS"):
        F.gelu(sn.tensor(np.ones(3, np.float32)))


def _forbid_numba(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("Numba code ran with kernels off")
    monkeypatch.setattr(_cpu.CpuKernel, "__call__", boom)
    for name in ("njit", "jit", "vectorize", "guvectorize"):
        monkeypatch.setattr(_numba.numba, name, boom)


def _every_op(dtype):
    """Forward and backward of every op that asks for kernels, then an
    optimizer step of each kind; returns the gradients."""
    rng = np.random.default_rng(0)
    x, w, b = (sn.tensor(rng.standard_normal(s).astype(dtype), requires_grad=True)
               for s in ((6, 5), (4, 5), (4,)))
    h = LayerNorm.apply(F.linear(x, w, b, activation="gelu"), b, b)
    for name in ACTS:
        h = F.linear(h, w[:, :4], b, activation=name)
    h = F.gelu(F.gelu(h, approximate="tanh")) + F.relu(h) + F.tanh(h) + F.sigmoid(h)
    emb = sn.tensor(np.ones((3, 4), dtype), requires_grad=True)
    h = h + F.embedding(np.array([0, 2, 1, 0, 2, 1]), emb)
    F.cross_entropy(h, np.array([0, 1, 2, 3, 0, 1])).backward()
    params = [x, w, b, emb]
    grads = [p.grad.numpy() for p in params]
    for opt in (optim.SGD(params, lr=0.1, momentum=0.9), optim.Adam(params)):
        opt.step()
    return grads


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_with_kernels_off_no_numba_code_runs(dtype, monkeypatch):
    with kernels.use("numba"):
        want = _every_op(dtype)
    _forbid_numba(monkeypatch)
    with kernels.use("xp"):
        got = _every_op(dtype)
    with pytest.raises(AssertionError, match="Numba code ran"):  # the check can fail
        _every_op(dtype)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)


def _graph(dtype):
    rng = np.random.default_rng(1)
    x, w, b = (sn.tensor(rng.standard_normal(s).astype(dtype), requires_grad=True)
               for s in ((6, 5), (4, 5), (4,)))
    emb = sn.tensor(rng.standard_normal((3, 4)).astype(dtype), requires_grad=True)
    h = F.linear(x, w, b, activation="sigmoid") + F.embedding(np.array([0, 2, 1, 0, 2, 1]), emb)
    h = F.linear(F.gelu(LayerNorm.apply(h, b, b)), w[:, :4], b, activation="gelu")
    return F.cross_entropy(h, np.array([0, 1, 2, 3, 0, 1])), [x, w, b, emb]


@pytest.mark.parametrize("forward_mode,backward_mode", [("numba", "xp"), ("xp", "numba")])
def test_forward_decides_for_backward(float64, forward_mode, backward_mode, monkeypatch):
    with kernels.use("xp"):
        loss_xp, params = _graph(np.float64)
        loss_xp.backward()
    want = [p.grad.numpy() for p in params]
    with kernels.use(forward_mode):
        mixed, params = _graph(np.float64)
    if forward_mode == "xp":  # decided at forward: backward runs no kernel
        _forbid_numba(monkeypatch)
    with kernels.use(backward_mode):
        mixed.backward()
    np.testing.assert_allclose(mixed.item(), loss_xp.item(), rtol=1e-12)
    for p, w in zip(params, want):
        np.testing.assert_allclose(p.grad, w, rtol=1e-10, atol=1e-12)


def test_ops_hold_the_kernels_forward_chose(float64):
    x = sn.tensor(np.ones((2, 3)), requires_grad=True)
    out = LayerNorm.apply(x)
    assert out._ctx.backward_kernel is norm.backward
    logits = F.cross_entropy(x, np.array([0, 1]))
    assert logits._ctx.backward_kernel is loss.backward
    with kernels.use("xp"):
        assert LayerNorm.apply(x)._ctx.backward_kernel is None


# -- no dead kernels ---------------------------------------------------------------------------
# A compiled kernel that an op calls without a TABLE row would be listed here,
# "module.attribute": "the op that calls it" (none does).
DIRECT_USE = {}


def _compiled_kernels():
    """Every CpuKernel a kernels module defines (alone or in a dict): id -> name."""
    found = {}
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"spmdnet.kernels.{info.name}")
        for attr, value in vars(module).items():
            entries = value.items() if isinstance(value, dict) else [(None, value)]
            for key, kernel in entries:
                if isinstance(kernel, _cpu.CpuKernel):
                    found[id(kernel)] = f"{info.name}.{attr}" + ("" if key is None else
                                                                 f"[{key!r}]")
    return found


class _OneRank:
    """A batch norm group of this rank alone: combining and reducing keep the values."""

    def combine(self, count, mean, m2):
        return count, mean, m2

    def allreduce(self, sums):
        return sums


def _every_row(dtype):
    """Forward and backward of ops that, together, ask for every TABLE row."""
    rng = np.random.default_rng(5)

    def t(*shape):
        return sn.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)

    x, w, b, emb = t(6, 5), t(4, 5), t(4), t(3, 4)
    h = F.linear(x, w, b, activation="relu") + F.linear(x, w, b, activation="sigmoid")
    h = h + F.linear(x, w, b, activation="gelu") + F.linear(x, w, b, activation="gelu_tanh")
    h = F.gelu(h) + F.gelu(h, approximate="tanh") + F.softmax(h, dim=-1) + F.relu(h)
    h = F.layer_norm(h, (4,), b, b) + F.embedding(np.array([0, 2, 1, 0, 2, 1]), emb)
    q = t(2, 3, 4)
    attention = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    image = t(2, 1, 6, 6)
    pooled = F.max_pool2d(F.conv2d(image, t(2, 1, 3, 3), padding=1), 2)
    pooled = pooled + F.conv2d(image, t(2, 1, 3, 3), padding=1, stride=2)  # col2im
    # an image as wide as CHANNELS_LAST_MIN_WIDTH: the compiled channels-last pass
    strip = F.conv2d(t(1, 2, 1, dispatch.CHANNELS_LAST_MIN_WIDTH), t(1, 2, 1, 3), stride=2)
    channels = dispatch.WINOGRAD_MIN_CHANNELS
    wide = F.conv2d(t(1, channels, 4, 4), t(channels, channels, 3, 3), padding=1)
    total = F.cross_entropy(h, np.array([0, 1, 2, 3, 0, 1])) + attention.sum() + pooled.sum()
    total = total + strip.sum()
    normed = F.batch_norm(wide, sn.zeros(channels, dtype=dtype), sn.ones(channels, dtype=dtype),
                          t(channels), t(channels), training=True)
    # a group of one rank: the sums and the input gradient as two calls (SyncBatchNorm's)
    grouped = batchnorm.batch_norm(wide, None, None, t(channels), t(channels), training=True,
                                   group=_OneRank())
    total = total + wide.sum() + (normed * normed).sum() + (grouped * grouped).sum()
    seq, _ = nn.LSTM(4, 3, dtype=dtype)(h.reshape(3, 2, 4))
    total = total + seq.sum()
    total.backward()
    params = [x, w, b, emb]
    for opt in (optim.SGD(params, lr=0.1, momentum=0.9), optim.Adam(params)):
        opt.step()


def _reached(monkeypatch):
    """The TABLE (op, step) pairs that lookup handed out during ``_every_row``
    and the ids of the CpuKernels that ran inside those kernels' calls."""
    handed_out, ran, depth = set(), set(), [0]
    run = _cpu.CpuKernel.__call__

    def recording_run(self, *args):
        if depth[0]:
            ran.add(id(self))
        return run(self, *args)

    def recording_lookup(op, *arrays, step="forward"):
        kernel = dispatch.lookup(op, *arrays, step=step)
        if kernel is None:
            return None
        handed_out.add((op, step))

        def row_kernel(*args, **kwargs):
            depth[0] += 1
            try:
                return kernel(*args, **kwargs)
            finally:
                depth[0] -= 1
        return row_kernel

    with monkeypatch.context() as patch:
        patch.setattr(_cpu.CpuKernel, "__call__", recording_run)
        patch.setattr(kernels, "lookup", recording_lookup)
        with kernels.use("numba"), np.errstate(all="ignore"):
            for dtype in (np.float32, np.float64):
                _every_row(dtype)
    return handed_out, ran


def test_every_compiled_kernel_is_reached_from_a_table_row(monkeypatch):
    compiled = _compiled_kernels()
    assert len(compiled) >= 15  # the discovery finds the kernels at all
    handed_out, ran = _reached(monkeypatch)
    rows = {(op, step) for op, rule in dispatch.TABLE.items() for step in rule.kernels}
    assert rows <= handed_out, f"rows the workload missed: {sorted(rows - handed_out)}"
    dead = sorted(name for key, name in compiled.items()
                  if key not in ran and name not in DIRECT_USE)
    assert not dead, f"compiled kernels no TABLE row reaches (delete them): {dead}"
    # the check can fail: without its row, max pooling's kernel is dead
    monkeypatch.setitem(dispatch.TABLE, "max_pool2d", dispatch.Rule({}))
    ran = _reached(monkeypatch)[1]
    assert sorted(name for key, name in compiled.items() if key not in ran) == \
        ["pool._max_pool_kernel"]
