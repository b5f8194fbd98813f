"""Ops on meta tensors give meta results of PyTorch's shape and dtype, with
no data behind them (spmdnet/_meta.py, autograd/meta.py). The expected
shapes and dtypes are PyTorch 2.13's (CPU wheel), observed by running each
line below with ``torch`` in place of ``sn`` on meta tensors; so are the
refusals (NotImplementedError for shapes that depend on values and for
copying data out, an error for reading a value) and the meta gradients of
``backward()``."""
import time
import tracemalloc

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import nn
from spmdnet.autograd.function import Function
from spmdnet.autograd.meta import register_shape_rule

f32, f64, i64, i32, b = sn.float32, sn.float64, sn.int64, sn.int32, sn.bool


def m(*shape, dtype=f32, requires_grad=False):
    return sn.empty(*shape, device="meta", dtype=dtype, requires_grad=requires_grad)


# (name, op, PyTorch's result shape, PyTorch's result dtype)
OPS = [
    ("matmul", lambda: m(2, 3) @ m(3, 5), (2, 5), f32),
    ("batched matmul", lambda: m(4, 1, 2, 3) @ m(6, 3, 5), (4, 6, 2, 5), f32),
    ("matrix-vector", lambda: m(2, 3) @ m(3), (2,), f32),
    ("linear", lambda: F.linear(m(7, 4, 3), m(5, 3), m(5)), (7, 4, 5), f32),
    ("add scalar", lambda: m(2, 3) + 1, (2, 3), f32),
    ("int plus float scalar", lambda: m(2, 3, dtype=i64) + 1.5, (2, 3), f32),
    ("broadcast", lambda: m(4, 1, 3) * m(5, 1), (4, 5, 3), f32),
    ("promotion", lambda: m(3, dtype=f64) - m(3), (3,), f64),
    ("int / int", lambda: m(2, dtype=i64) / m(2, dtype=i64), (2,), f32),
    ("compare", lambda: m(2, 3) < m(3), (2, 3), b),
    ("sum", lambda: m(2, 3).sum(), (), f32),
    ("sum int32", lambda: m(2, 3, dtype=i32).sum(), (), i64),
    ("sum bool", lambda: m(2, 3, dtype=b).sum(), (), i64),
    ("mean dim", lambda: m(2, 3, dtype=i64).float().mean(1), (2,), f32),
    ("max dim", lambda: m(3, 4).max(1)[1], (3,), i64),
    ("argmax", lambda: m(3, 4).argmax(1), (3,), i64),
    ("cumsum int32", lambda: m(2, 3, dtype=i32).cumsum(1), (2, 3), i64),
    ("topk", lambda: m(4, 6).topk(2)[1], (4, 2), i64),
    ("sort", lambda: m(4, 6).sort()[1], (4, 6), i64),
    ("where", lambda: sn.where(m(2, 3, dtype=b), m(2, 3), 0.0), (2, 3), f32),
    ("permute", lambda: m(2, 3, 4).permute(2, 0, 1), (4, 2, 3), f32),
    ("view", lambda: m(2, 3, 4).view(6, 4), (6, 4), f32),
    ("cat", lambda: sn.cat([m(2, 3), m(4, 3)]), (6, 3), f32),
    ("stack", lambda: sn.stack([m(2, 3), m(2, 3)], 1), (2, 2, 3), f32),
    ("int index", lambda: m(5, 3)[m(4, dtype=i64)], (4, 3), f32),
    ("cpu index", lambda: m(5, 3)[sn.tensor([0, 1])], (2, 3), f32),
    ("gather", lambda: m(4, 6).gather(1, m(4, 2, dtype=i64)), (4, 2), f32),
    ("embedding", lambda: F.embedding(m(4, 7, dtype=i64), m(10, 3)), (4, 7, 3), f32),
    ("one_hot", lambda: F.one_hot(m(3, dtype=i64), 4), (3, 4), i64),
    ("conv1d", lambda: F.conv1d(m(2, 3, 10), m(5, 3, 3)), (2, 5, 8), f32),
    ("conv2d", lambda: F.conv2d(m(2, 3, 8, 8), m(4, 3, 3, 3), padding=1, stride=2),
     (2, 4, 4, 4), f32),
    ("conv_transpose2d", lambda: F.conv_transpose2d(m(2, 3, 5, 5), m(3, 4, 3, 3), stride=2),
     (2, 4, 11, 11), f32),
    ("max_pool2d", lambda: F.max_pool2d(m(2, 3, 8, 8), 2), (2, 3, 4, 4), f32),
    ("avg_pool2d", lambda: F.avg_pool2d(m(1, 2, 7, 7), 3, stride=2), (1, 2, 3, 3), f32),
    ("adaptive_avg_pool2d", lambda: F.adaptive_avg_pool2d(m(1, 2, 7, 7), (3, 2)),
     (1, 2, 3, 2), f32),
    ("interpolate", lambda: F.interpolate(m(1, 2, 4, 4), scale_factor=2), (1, 2, 8, 8), f32),
    ("pad", lambda: F.pad(m(2, 3), (1, 2)), (2, 6), f32),
    ("layer_norm", lambda: F.layer_norm(m(2, 3, 8), (8,)), (2, 3, 8), f32),
    ("batch_norm", lambda: F.batch_norm(m(2, 3, 4), m(3), m(3), training=True), (2, 3, 4), f32),
    ("group_norm", lambda: F.group_norm(m(2, 4, 5), 2), (2, 4, 5), f32),
    ("softmax", lambda: F.softmax(m(2, 3), -1), (2, 3), f32),
    ("log_softmax", lambda: F.log_softmax(m(3, 4), 1), (3, 4), f32),
    ("gelu", lambda: F.gelu(m(2, 3)), (2, 3), f32),
    ("dropout", lambda: F.dropout(m(2, 3), 0.5), (2, 3), f32),
    ("sdpa with dropout", lambda: F.scaled_dot_product_attention(m(2, 3, 4), m(2, 5, 4),
                                                                 m(2, 5, 4), dropout_p=0.5),
     (2, 3, 4), f32),
    ("cross_entropy", lambda: F.cross_entropy(m(4, 5), m(4, dtype=i64)), (), f32),
    ("cross_entropy probs", lambda: F.cross_entropy(m(3, 4), m(3, 4)), (), f32),
    ("nll_loss", lambda: F.nll_loss(m(3, 4), m(3, dtype=i64)), (), f32),
    ("mse_loss", lambda: F.mse_loss(m(3, 4), m(3, 4)), (), f32),
    ("bce_with_logits", lambda: F.binary_cross_entropy_with_logits(m(3, 4), m(3, 4)), (), f32),
    ("lstm", lambda: nn.LSTM(3, 4, device="meta")(m(5, 2, 3))[0], (5, 2, 4), f32),
    ("bidirectional lstm c_n", lambda: nn.LSTM(3, 4, device="meta", bidirectional=True)(
        m(5, 2, 3))[1][1], (2, 2, 4), f32),
    ("gru", lambda: nn.GRU(3, 4, device="meta")(m(5, 2, 3))[0], (5, 2, 4), f32),
    ("relu rnn h_n", lambda: nn.RNN(3, 4, nonlinearity="relu", device="meta")(m(5, 2, 3))[1],
     (1, 2, 4), f32),
    ("sdpa value broadcasts", lambda: F.scaled_dot_product_attention(
        m(1, 4, 3, dtype=f64), m(1, 5, 3, dtype=f64), m(2, 5, 2, dtype=f64), dropout_p=0.3),
     (2, 4, 2), f64),
    ("softplus", lambda: F.softplus(m(2, 3), beta=2), (2, 3), f32),
    ("elu float64", lambda: F.elu(m(2, 3, dtype=f64)), (2, 3), f64),
    ("sqrt int64", lambda: m(2, 3, dtype=i64).sqrt(), (2, 3), f32),
    ("embedding float64", lambda: F.embedding(m(4, 7, dtype=i64), m(10, 3, dtype=f64)),
     (4, 7, 3), f64),
    ("cpu to meta", lambda: sn.zeros(3, 4).to("meta"), (3, 4), f32),
    ("0-d cpu operand", lambda: m(2, 3) + sn.tensor(1.0), (2, 3), f32),
]


@pytest.mark.parametrize("name, op, shape, dtype", OPS, ids=[o[0] for o in OPS])
def test_op_on_meta_gives_pytorchs_shape_and_dtype(name, op, shape, dtype):
    before = sn.get_rng_state().numpy().copy()
    out = op()
    assert out.is_meta and out.device == sn.device("meta"), name
    assert tuple(out.shape) == shape and out.dtype == dtype, \
        f"{name}: {tuple(out.shape)} {out.dtype}, PyTorch's {shape} {dtype}"
    # PyTorch's meta dropout (and every other meta op) draws nothing
    np.testing.assert_array_equal(sn.get_rng_state().numpy(), before)


def test_module_forward_and_backward_on_meta_as_pytorchs():
    """PyTorch: a meta TransformerEncoderLayer in train mode maps (5, 2, 16)
    to (5, 2, 16) float32 meta, draws nothing, and backward leaves meta
    gradients of each parameter's shape."""
    with sn.device("meta"):
        layer = nn.TransformerEncoderLayer(16, 4, 32)
    before = sn.get_rng_state().numpy().copy()
    y = layer(sn.empty(5, 2, 16, device="meta"))
    assert y.is_meta and tuple(y.shape) == (5, 2, 16) and y.dtype == f32
    y.sum().backward()
    np.testing.assert_array_equal(sn.get_rng_state().numpy(), before)
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.is_meta, name
        assert p.grad.shape == p.shape and p.grad.dtype == p.dtype, name
    with sn.device("meta"):
        mha = nn.MultiheadAttention(8, 2, dropout=0.5, dtype=f64)
    out, weights = mha(m(5, 3, 8, dtype=f64), m(7, 3, 8, dtype=f64), m(7, 3, 8, dtype=f64))
    assert (tuple(out.shape), tuple(weights.shape)) == ((5, 3, 8), (3, 5, 7))
    assert out.is_meta and weights.is_meta and out.dtype == f64


def test_meta_leaf_gets_a_meta_gradient():
    w = m(3, 4, requires_grad=True)
    (w @ m(4, 2)).relu().sum().backward()
    assert w.grad.is_meta and tuple(w.grad.shape) == (3, 4) and w.grad.dtype == f32


def _peak_bytes(fn):
    """fn's result and the peak of the memory allocated during the call
    (NumPy reports its arrays' data to tracemalloc)."""
    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_large_meta_forward_and_backward_take_no_memory_or_time():
    """The shapes of a 1.6 GB layer and a (64, 3, 224, 224) image network,
    forward and backward, without the work or the memory of the data."""
    _, peak = _peak_bytes(_large_network)
    assert peak < 4 << 20, f"{peak / 2**20:.1f} MiB allocated"  # the data: gigabytes


def _large_network():
    start = time.perf_counter()
    with sn.device("meta"):
        big = nn.Linear(20000, 20000)
        net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 112 * 112, 10))
    big(m(64, 20000)).sum().backward()
    out = net(m(64, 3, 224, 224))
    out.sum().backward()
    assert tuple(out.shape) == (64, 10) and net[0].weight.grad.is_meta
    assert big.weight.grad.is_meta and tuple(big.weight.grad.shape) == (20000, 20000)
    assert time.perf_counter() - start < 20  # the data's work: minutes


# ops whose forward on data allocates (or loops over) the data: on meta,
# shape rules (ops/_meta_rules.py, ops/attention.py); (shape, op on it)
LARGE = [
    ("gelu", lambda: F.gelu(m(2048, 2048))),
    ("gelu tanh", lambda: F.gelu(m(2048, 2048), approximate="tanh")),
    ("softplus", lambda: F.softplus(m(2048, 2048))),
    ("elu", lambda: F.elu(m(2048, 2048))),
    ("leaky_relu", lambda: F.leaky_relu(m(2048, 2048))),
    ("relu6", lambda: F.relu6(m(2048, 2048))),
    ("silu", lambda: F.silu(m(2048, 2048))),
    ("sqrt", lambda: m(2048, 2048).sqrt()),
    ("clamp", lambda: m(2048, 2048).clamp(-1, 1)),
    ("embedding", lambda: F.embedding(m(2048, 256, dtype=i64), m(10, 8))),
    ("sdpa", lambda: F.scaled_dot_product_attention(*[m(16, 8, 512, 64)] * 3, dropout_p=0.1)),
    ("sdpa causal", lambda: F.scaled_dot_product_attention(*[m(16, 8, 512, 64)] * 3,
                                                           is_causal=True)),
    ("conv2d", lambda: F.conv2d(m(64, 32, 64, 64), m(32, 32, 3, 3), padding=1)),
    ("max_pool2d", lambda: F.max_pool2d(m(64, 32, 128, 128), 2)),
    ("lstm", lambda: nn.LSTM(64, 64, device="meta")(m(512, 256, 64))[0]),
    ("gru", lambda: nn.GRU(64, 64, device="meta")(m(512, 256, 64))[0]),
    ("rnn", lambda: nn.RNN(64, 64, device="meta")(m(512, 256, 64))[0]),
]


@pytest.mark.parametrize("name, op", LARGE, ids=[o[0] for o in LARGE])
def test_large_meta_op_allocates_nothing_of_the_datas_size(name, op):
    """Each result (or its input) is 16 MiB or more of data; the call's peak
    allocation stays under 1 MiB (the module's own parameters are meta too)."""
    start = time.perf_counter()
    out, peak = _peak_bytes(op)
    assert out.is_meta and out.numel() * 4 >= 16 << 20, name
    assert peak < 1 << 20, f"{name}: {peak / 2**20:.1f} MiB allocated on meta inputs"
    assert time.perf_counter() - start < 2, name  # the time loop over 512 steps: seconds


@pytest.mark.parametrize("op", [
    lambda: m(2, 3)[m(2, 3, dtype=b)],  # PyTorch: NotImplementedError (nonzero on meta)
    lambda: m(2, 3).to("cpu"),  # PyTorch: "Cannot copy out of meta tensor; no data!"
    lambda: m(3).numpy(),
    lambda: F.one_hot(m(3, dtype=i64)),  # the class count would come from the values
], ids=["bool mask index", "to cpu", "numpy", "one_hot without num_classes"])
def test_value_dependent_results_and_copies_out_refuse(op):
    with pytest.raises(NotImplementedError, match="meta"):
        op()


@pytest.mark.parametrize("read", [lambda t: t.item(), lambda t: bool(t), lambda t: float(t)])
def test_reading_a_value_refuses(read):
    # PyTorch: RuntimeError "Tensor.item() cannot be called on meta tensors";
    # NotImplementedError is a RuntimeError
    with pytest.raises(RuntimeError, match="meta"):
        read(m(()))


def test_cpu_to_meta_keeps_the_graph_and_backward_refuses_as_pytorch():
    """PyTorch: ``x.to("meta")`` requires grad (ToCopyBackward); backward to
    the CPU leaf raises NotImplementedError (no data to copy back)."""
    x = sn.randn(3, requires_grad=True)
    y = x.to("meta")
    assert y.is_meta and y.requires_grad
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        y.sum().backward()


def test_errors_on_meta_are_those_on_data():
    """Argument errors are raised as on CPU tensors (PyTorch's meta kernels
    check arguments too); an op that cannot run shape-only names itself."""
    with pytest.raises(RuntimeError, match="mean"):  # PyTorch: mean() of int64 refuses
        m(2, 3, dtype=i64).mean()
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4, 5\)"):  # spmdnet's matmul check
        m(2, 3) @ m(4, 5)
    with pytest.raises(NotImplementedError, match="^Index on the 'meta' device: indexing "
                       "with a boolean mask"):
        m(2, 3)[m(2, 3, dtype=b)]


# NumPy on MetaArrays against NumPy on real arrays of the same shapes and dtypes
NUMPY = [
    lambda a, b, i: a + b, lambda a, b, i: a * 2.5, lambda a, b, i: i + 1.5,
    lambda a, b, i: i // 2, lambda a, b, i: np.divmod(a, 3.0), lambda a, b, i: a @ b.T,
    lambda a, b, i: np.matmul(a[0], b.T), lambda a, b, i: a @ b[0],
    lambda a, b, i: a.sum(), lambda a, b, i: a.sum(axis=(0, -1), keepdims=True),
    lambda a, b, i: i.sum(axis=1), lambda a, b, i: a.mean(axis=1), lambda a, b, i: a.var(0),
    lambda a, b, i: np.maximum.reduce(a, axis=-1), lambda a, b, i: np.cumsum(i, axis=0),
    lambda a, b, i: np.add.outer(a[0], b[:, 0]), lambda a, b, i: a.argmax(axis=1),
    lambda a, b, i: np.argsort(a, axis=0), lambda a, b, i: np.concatenate([a, b], 1),
    lambda a, b, i: np.stack([a, b]), lambda a, b, i: np.einsum("ij,kj->ik", a, b),
    lambda a, b, i: np.where(a > 0, a, i), lambda a, b, i: np.pad(a, ((1, 2), (0, 3))),
    lambda a, b, i: a[i[0]], lambda a, b, i: a[1:, ::2], lambda a, b, i: a.T.reshape(-1),
    lambda a, b, i: np.take_along_axis(a, i, axis=1), lambda a, b, i: a.astype(np.float16),
    lambda a, b, i: np.tensordot(a, b, axes=([1], [1])), lambda a, b, i: a.ravel(),
]


@pytest.mark.parametrize("k", range(len(NUMPY)))
def test_numpy_on_meta_arrays_gives_numpys_shapes_and_dtypes(k):
    real = (np.ones((3, 4), np.float32), np.ones((3, 4), np.float64),
            np.zeros((3, 4), np.int32))
    meta = tuple(m(*a.shape, dtype=a.dtype).array for a in real)
    want, got = NUMPY[k](*real), NUMPY[k](*meta)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    for w, g in zip(want, got, strict=True):
        assert type(g).__name__ == "MetaArray" and (g.shape, g.dtype) == (w.shape, w.dtype)


def test_shape_rules_are_keyed_by_the_op_class():
    """A rule belongs to its class (a string name could go stale silently):
    the meta path calls it in place of forward; a subclass without its own
    rule runs forward; a name is refused."""
    class Probe(Function):
        def forward(self, a):
            raise AssertionError("forward ran on meta inputs")

    class Sub(Probe):
        pass

    register_shape_rule(Probe, lambda a: (a.shape[::-1], np.float16))
    out = Probe.apply(m(2, 3))
    assert out.is_meta and tuple(out.shape) == (3, 2) and out.dtype == sn.float16
    with pytest.raises(AssertionError, match="forward ran"):
        Sub.apply(m(2, 3))
    with pytest.raises(TypeError, match="an op class"):
        register_shape_rule("Conv2d", lambda x, w: (x.shape, x.dtype))
