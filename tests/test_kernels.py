"""Numba kernels (spmdnet.kernels) against their plain-xp references.

Every kernel, forward and backward, float32 and float64, on random and edge
shapes: empty, one element, odd, large, 3-D, non-contiguous, NaN/inf. Also:
the float32 fast math against ``math``; the fused linear layer against the
unfused ops (and finite differences); the ops' dispatch and knob; training
with kernels on and off; the compile cache policy.

``test_plain_python_and_cuda_simulator`` runs this file again in a
subprocess with ``NUMBA_DISABLE_JIT=1`` (kernel bodies as plain Python) and
``NUMBA_ENABLE_CUDASIM=1``, where the ``cudasim`` cases run the CUDA kernels
on NumPy arrays in Numba's CUDA simulator (small shapes only: it is slow).
"""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from spmdnet.autograd import gradcheck

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import kernels, nn, optim
from spmdnet.kernels import _jit, activation, embedding, loss, norm, special
from spmdnet.ops import nn_ops, unary

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
PLAIN_PYTHON = os.environ.get("NUMBA_DISABLE_JIT") == "1"
DTYPES = [np.float32, np.float64]
ACTS = list(activation.ACTIVATIONS)


def tol(dtype):
    """Kernels round differently (summation order, float32 polynomials)."""
    if np.dtype(dtype) == np.float32:  # torch.testing's float32 atol, looser rtol
        return {"rtol": 2e-5, "atol": 1e-5}
    return {"rtol": 1e-12, "atol": 1e-13}


@pytest.fixture(params=["cpu", "cudasim"])
def target(request):
    """Run the kernels on the CPU, or (in the subprocess) the CUDA ones on
    the simulator."""
    if request.param == "cudasim":
        if not SIMULATOR:
            pytest.skip("CUDA simulator cases run in the NUMBA_ENABLE_CUDASIM=1 subprocess")
        with _jit.cuda_simulation():
            yield "cudasim"
    else:
        yield "cpu"


def shapes(target):
    """Random and edge shapes of (rows, features) arrays; 'large' is big
    enough for the 8-way reductions' main loops and tails. The simulator
    gets fewer rows: it runs every CUDA thread as a Python thread."""
    if target == "cudasim":
        return [(3, 13), (0, 5), (1, 1), (2, 1, 17)]
    return [(7, 13), (0, 5), (1, 1), (3, 17), (2, 3, 5), (64, 1031)]


def arrays(shape, dtype, seed=0, special_values=False, contiguous=True):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(dtype) * 2
    if special_values and a.size >= 6:
        flat = a.reshape(-1)
        flat[[0, 2, 4, 5]] = [np.nan, np.inf, -np.inf, 0.0]
    if not contiguous:  # the same values, in every other column of a wider array
        wide = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
        wide[..., ::2] = a
        a = wide[..., ::2]
        assert not a.flags.c_contiguous
    return a


def cases(target):
    """(shape, special_values, contiguous) for the elementwise kernels."""
    out = [(s, False, True) for s in shapes(target)]
    return out + [((2, 9), True, True), ((2, 6), False, False)]


# -- float32 fast math ----------------------------------------------------------------
def _apply_body(a, out, which):
    for i in range(a.size):
        if which == 0:
            out[i] = special.exp(a[i])
        elif which == 1:
            out[i] = special.erf(a[i])
        else:
            out[i] = special.tanh(a[i])


_apply = _jit.CpuKernel(_apply_body)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which,ref", [(0, math.exp), (1, math.erf), (2, math.tanh)])
def test_special_functions_match_math(dtype, which, ref):
    rng = np.random.default_rng(3)
    edges = [0.0, -0.0, 1e-30, -1e-30, 3e-4, 5e-4, 1.0, -1.0, 3.99, 4.0, 4.01, 7.9, 8.0, 20.0,
             -20.0, 88.7, 88.8, 89.0, -87.3, -87.4, -103.0, -104.0, -200.0, 709.0, 710.0,
             np.inf, -np.inf, np.nan]
    a = np.concatenate([rng.standard_normal(5000) * 3, rng.uniform(-100, 100, 2000),
                        edges]).astype(dtype)
    out = np.empty_like(a)
    _apply(a, out, which)

    def reference(v):
        if math.isnan(v):
            return math.nan
        try:
            return ref(v)
        except OverflowError:
            return math.inf
    expected = np.array([reference(float(v)) for v in a])
    if dtype == np.float32:  # subnormal results may be flushed to 0 (see special.py)
        with np.errstate(over="ignore"):
            np.testing.assert_allclose(out, expected.astype(np.float32), rtol=1e-6,
                                       atol=np.finfo(np.float32).tiny)
    else:
        np.testing.assert_allclose(out, expected, rtol=1e-15, atol=0)


# -- activations --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ACTS)
def test_activation_kernels_match_xp(target, name, dtype):
    for k, (shape, special_values, contiguous) in enumerate(cases(target)):
        x = arrays(shape, dtype, k, special_values, contiguous)
        g = arrays(shape, dtype, k + 100, special_values)
        bias = arrays(shape[-1:], dtype, k + 200)
        with np.errstate(all="ignore"):
            out_ref, saved_ref = unary.act_forward(name, x + bias)
            gx_ref = unary.act_backward(name, g, saved_ref)
            gb_ref = gx_ref.reshape(-1, shape[-1]).sum(axis=0)
            # with a bias, in place on a fresh buffer (the fused linear layer)
            h = np.ascontiguousarray(x)
            out, saved = activation.forward(h, bias, name, inplace=True)
            gx, gb = activation.backward(g, saved, name, bias_grad=True)
            # without a bias, input untouched (the activation ops)
            before = x.copy()
            out0, saved0 = activation.forward(x, None, name)
            gx0, gb0 = activation.backward(g, saved0, name)
            out0_ref, saved0_ref = unary.act_forward(name, x)
            gx0_ref = unary.act_backward(name, g, saved0_ref)
        assert gb0 is None
        np.testing.assert_array_equal(x, before)
        if name not in activation.SAVES_INPUT:
            assert out is h  # in place
        for got, want in [(out, out_ref), (gx, gx_ref), (out0, out0_ref), (gx0, gx0_ref)]:
            assert got.shape == want.shape and got.dtype == dtype
            np.testing.assert_allclose(got, want, **tol(dtype), err_msg=f"{shape}")
        rows = max(1, x.size // max(1, shape[-1]))  # gb sums rows: rounding adds up
        np.testing.assert_allclose(gb, gb_ref, rtol=tol(dtype)["rtol"],
                                   atol=tol(dtype)["atol"] * rows, err_msg=f"{shape}")
        if name == "relu":  # plain comparisons and sums in row order: the same bits
            for got, want in [(out, out_ref), (gx, gx_ref), (gb, gb_ref)]:
                np.testing.assert_array_equal(got, want)
        with np.errstate(all="ignore"):  # what one side saved, the other can use
            mixed = [unary.act_backward(name, g, saved),
                     activation.backward(g, saved_ref, name)[0]]
        for got in mixed:
            np.testing.assert_allclose(got, gx_ref, **tol(dtype), err_msg=f"{shape}")


def test_activation_backward_writes_bias_gradient_into_buffer(target):
    x, g = arrays((5, 7), np.float32), arrays((5, 7), np.float32, 1)
    out, saved = activation.forward(x.copy(), np.ones(7, np.float32), "gelu", inplace=True)
    buf = np.full(7, np.nan, np.float32)
    _, gb = activation.backward(g, saved, "gelu", bias_grad=True, bias_out=buf)
    assert gb is buf and np.isfinite(buf).all()


def test_activation_wrappers_reject_bad_input():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="activation must be one of"):
        activation.forward(x, None, "swish")
    with pytest.raises(ValueError, match="does not match the last axis"):
        activation.forward(x, np.ones(4, np.float32), "relu")
    with pytest.raises(TypeError, match="float32 or float64"):
        activation.forward(x.astype(np.float16), None, "relu")
    with pytest.raises(TypeError, match="float32 or float64"):
        activation.forward(x, np.ones(3, np.float64), "relu")
    with pytest.raises(ValueError, match="C-contiguous"):
        activation.forward(np.ones((3, 2), np.float32).T, None, "relu", inplace=True)
    with pytest.raises(ValueError, match="does not match the saved"):
        activation.backward(x, np.ones((3, 2), np.float32), "relu")


# -- cross-entropy ------------------------------------------------------------------------
def ce_reference(logits, labels, scale):
    with np.errstate(all="ignore"):
        logp = nn_ops._log_softmax(logits, axis=1)
        rows = np.arange(len(labels))
        grad = np.exp(logp)
        grad[rows, labels] -= 1
        return -logp[rows, labels], grad * scale[:, None]


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_kernels_match_xp(target, dtype):
    sizes = [(3, 13), (1, 1), (2, 17), (0, 4)]
    if target == "cpu":
        sizes += [(7, 2), (64, 1031), (8, 32000)]
    for k, (n, c) in enumerate(sizes):
        rng = np.random.default_rng(k)
        logits = arrays((n, c), dtype, k) * 3
        labels = rng.integers(0, c, n) if c else np.zeros(n, np.int64)
        scale = rng.uniform(0.5, 2, n).astype(dtype)
        losses, probs = loss.forward(logits, labels)
        grad = loss.backward(probs, labels, scale)
        want_losses, want_grad = ce_reference(logits, labels, scale)
        np.testing.assert_allclose(losses, want_losses, **tol(dtype), err_msg=f"{n}x{c}")
        np.testing.assert_allclose(grad, want_grad, **tol(dtype), err_msg=f"{n}x{c}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_kernels_nan_inf_and_layout(target, dtype):
    logits = arrays((6, 8), dtype, 5)
    logits[1, 3], logits[2, 0], logits[3, 5], logits[4, :] = np.nan, np.inf, -np.inf, -np.inf
    labels = np.array([0, 1, 2, 3, 4, 7], np.int32)
    scale = np.full(6, 1 / 6, dtype)
    with np.errstate(all="ignore"):  # inf - inf (plain Python warns)
        losses, probs = loss.forward(logits, labels)
        grad = loss.backward(probs, labels, scale)
    want_losses, want_grad = ce_reference(logits, labels, scale)
    np.testing.assert_allclose(losses, want_losses, **tol(dtype))
    np.testing.assert_allclose(grad, want_grad, **tol(dtype))
    strided = arrays((6, 8), dtype, 6, contiguous=False)
    np.testing.assert_allclose(loss.forward(strided, labels)[0],
                               ce_reference(strided, labels, scale)[0], **tol(dtype))


def test_cross_entropy_kernel_rejects_bad_labels():
    logits = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="out of range"):
        loss.forward(logits, np.array([0, 4, 1]))
    with pytest.raises(TypeError, match="integers"):
        loss.forward(logits, np.array([0.0, 1.0, 1.0]))


# -- layer norm ---------------------------------------------------------------------------
def layer_norm_reference(x, g, weight, monkeypatch):
    monkeypatch.setenv("SPMDNET_KERNELS", "xp")
    op = nn_ops.LayerNorm()
    affine = (weight, weight[::-1].copy()) if weight is not None else ()
    op.needs_input_grad = (True,) * (1 + len(affine))
    with np.errstate(all="ignore"):
        out = op.forward(x, *affine, eps=1e-5)
        grads = op.backward(g)
    monkeypatch.delenv("SPMDNET_KERNELS")
    return (out, grads) if affine else (out, (grads, None, None))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_kernels_match_xp(target, dtype, affine, monkeypatch):
    for k, (shape, special_values, contiguous) in enumerate(cases(target)):
        if shape[-1] == 0 or math.prod(shape) == 0:
            continue
        x = arrays(shape, dtype, k, special_values, contiguous) + 1
        g = arrays(shape, dtype, k + 1)
        weight = arrays(shape[-1:], dtype, k + 2) if affine else None
        bias = weight[::-1].copy() if affine else None
        want_out, (want_gx, want_gw, want_gb) = layer_norm_reference(x, g, weight, monkeypatch)
        with np.errstate(all="ignore"):
            out, mean, rstd = norm.forward(x, weight, bias, eps=1e-5)
            gx, gw, gb = norm.backward(g, x, weight, mean, rstd)
        assert mean.shape == rstd.shape == shape[:-1]
        np.testing.assert_allclose(out, want_out, **tol(dtype), err_msg=f"{shape}")
        np.testing.assert_allclose(gx, want_gx, **tol(dtype), err_msg=f"{shape}")
        if affine:  # gw sums rows of g * xhat: tolerance grows with the row count
            np.testing.assert_allclose(gw, want_gw, rtol=tol(dtype)["rtol"] * 10,
                                       atol=tol(dtype)["atol"] * max(1, x.size // shape[-1]))
            np.testing.assert_allclose(gb, want_gb, **tol(dtype))
        else:
            assert gw is None and gb is None


def test_layer_norm_kernels_edges_and_buffers(target):
    x = np.zeros((0, 4), np.float32)
    out, mean, rstd = norm.forward(x, None, None)
    assert out.shape == (0, 4) and mean.shape == (0,)
    w = np.ones(4, np.float32)
    gx, gw, gb = norm.backward(x, x, w, mean, rstd)
    assert gx.shape == (0, 4) and (gw == 0).all() and (gb == 0).all()
    x, g = arrays((3, 4), np.float32), arrays((3, 4), np.float32, 1)
    _, mean, rstd = norm.forward(x, w, w)
    bw, bb = np.full(4, np.nan, np.float32), np.full(4, np.nan, np.float32)
    _, gw, gb = norm.backward(g, x, w, mean, rstd, weight_out=bw, bias_out=bb)
    assert gw is bw and gb is bb and np.isfinite(bw).all()
    np.testing.assert_allclose(gb, g.sum(axis=0), rtol=1e-6)
    with pytest.raises(ValueError, match="both weight and bias"):
        norm.forward(x, w, None)


# -- embedding ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_backward_matches_add_at_bit_for_bit(target, dtype):
    rng = np.random.default_rng(0)
    sizes = [((5,), 4, 3), ((2, 3), 6, 5), ((0,), 3, 2), ((1,), 1, 1), ((4,), 3, 0)]
    if target == "cpu":
        sizes += [((4096,), 1000, 64)]
    for idx_shape, num, d in sizes:
        idx = rng.integers(0, num, idx_shape)
        g = arrays(idx_shape + (d,), dtype, 1)
        want = np.zeros((num, d), dtype)
        np.add.at(want, idx.reshape(-1), g.reshape(idx.size, d))
        np.testing.assert_array_equal(embedding.backward(g, idx, num), want)
        buf = np.full((num, d), np.nan, dtype)
        assert embedding.backward(g, idx, num, out=buf) is buf
        np.testing.assert_array_equal(buf, want)
    with pytest.raises(ValueError, match="out of range"):
        embedding.backward(np.ones((2, 3), dtype), np.array([0, 5]), 4)


# -- optimizer updates (more in test_optim.py, which runs every optimizer test both ways) --
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.5, dampening=0.2),
    lambda ps: optim.Adam(ps, lr=0.01, weight_decay=0.01),
    lambda ps: optim.AdamW(ps, lr=0.01)], ids=["sgd-nesterov", "sgd-damp", "adam", "adamw"])
def test_optimizer_kernels_match_xp(target, dtype, make, monkeypatch):
    results = []
    for knob in ("numba", "xp"):
        monkeypatch.setenv("SPMDNET_KERNELS", knob)
        params = []
        for k, (shape, special_values, _) in enumerate(cases(target)):
            p = nn.Parameter(arrays(shape, dtype, k))
            p.grad = arrays(shape, dtype, k + 50, special_values)
            params.append(p)
        opt = make(params)
        with np.errstate(all="ignore"):
            for _ in range(3):
                opt.step()
        results.append([p.numpy() for p in params])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, **tol(dtype))


# -- the ops: fused linear layer, dispatch, knob --------------------------------------------
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


def test_fused_linear_bias_gradient_goes_into_grad_buffer(float64):
    x, w, b = _ops_inputs(3)
    wt, bt = sn.tensor(w, requires_grad=True), sn.tensor(b, requires_grad=True)
    bt.grad_buffer = np.zeros(4)
    F.linear(sn.tensor(x), wt, bt, activation="gelu").sum().backward()
    assert bt.grad is bt.grad_buffer and np.abs(bt.grad).sum() > 0


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


def test_knob_xp_keeps_ops_off_the_kernels(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a kernel ran with SPMDNET_KERNELS=xp")
    for module in (activation, loss, norm, embedding):
        for fn in ("forward", "backward"):
            if hasattr(module, fn):
                monkeypatch.setattr(module, fn, boom)
    monkeypatch.setenv("SPMDNET_KERNELS", "xp")
    x, w, b = (sn.tensor(a.astype(np.float32), requires_grad=True) for a in _ops_inputs())
    h = F.layer_norm(F.linear(x, w, b, activation="gelu"), b, b)
    F.cross_entropy(h, np.array([0, 1, 2, 3, 0, 1])).backward()
    emb = F.embedding(np.array([0, 2]), sn.tensor(np.ones((3, 2)), requires_grad=True))
    emb.sum().backward()
    monkeypatch.setenv("SPMDNET_KERNELS", "cuda")
    with pytest.raises(ValueError, match="SPMDNET_KERNELS"):
        F.gelu(x)


# -- training with kernels on and off ---------------------------------------------------------
def _train(kernels_on, optimizer, monkeypatch, steps=6):
    monkeypatch.setenv("SPMDNET_KERNELS", "numba" if kernels_on else "xp")
    sn.manual_seed(7)
    emb = nn.Embedding(11, 4)
    model = nn.Sequential(nn.LayerNorm(12), nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 16),
                          nn.ReLU(), nn.Linear(16, 8), nn.Sigmoid(), nn.Linear(8, 5))
    params = list(emb.parameters()) + list(model.parameters())
    opt = optim.SGD(params, lr=0.1, momentum=0.9) if optimizer == "sgd" else \
        optim.Adam(params, lr=1e-2)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        idx, labels = rng.integers(0, 11, (32, 3)), rng.integers(0, 5, 32)
        h = F.embedding(idx, emb.weight).reshape(32, 12)
        step_loss = F.cross_entropy(model(h), labels)
        opt.zero_grad()
        step_loss.backward()
        opt.step()
        losses.append(step_loss.item())
    return np.array(losses), [p.numpy() for p in params]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_training_with_and_without_kernels_gives_the_same_curve(float64, optimizer,
                                                                 monkeypatch):
    on, params_on = _train(True, optimizer, monkeypatch)
    off, params_off = _train(False, optimizer, monkeypatch)
    assert on[-1] < on[0]
    np.testing.assert_allclose(on, off, rtol=1e-11)
    for a, b in zip(params_on, params_off):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


# -- warm-up, compile cache ----------------------------------------------------------------
def test_warmup_compiles_and_reports_seconds():
    seconds = kernels.warmup([np.float32])
    assert seconds >= 0 and kernels.compile_seconds() >= 0
    assert kernels.warmup([np.float32]) < max(seconds, 0.5)  # compiled already


class FakeComm:
    """mpi4py-like communicator of one rank, recording the barriers."""

    def __init__(self, rank, gathered):
        self.rank, self.size, self.gathered, self.barriers = rank, len(gathered), gathered, 0

    def Get_rank(self):  # noqa: N802 - mpi4py's names
        return self.rank

    def Get_size(self):  # noqa: N802
        return self.size

    def allgather(self, value):
        assert value == self.gathered[self.rank], (value, self.gathered[self.rank])
        return list(self.gathered)

    def Barrier(self):  # noqa: N802
        self.barriers += 1


@pytest.mark.parametrize("rank,turn", [(0, 0), (1, 1), (2, 2), (3, 1), (4, 2)])
def test_compile_in_order_rank0_then_one_per_host_then_rest(rank, turn, monkeypatch,
                                                            tmp_path):
    monkeypatch.setenv("SPMDNET_KERNEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_jit, "_use_cache", lambda: True)  # keep Numba's config untouched
    hosts = ["a", "b", "a", "c", "c"]
    monkeypatch.setattr(_jit.socket, "gethostname", lambda: hosts[rank])
    comm = FakeComm(rank, [(h, True, _jit.cache_dir()) for h in hosts])
    seen = []
    assert _jit.compile_in_order(lambda: seen.append(comm.barriers) or "done", comm) == "done"
    assert seen == [turn] and comm.barriers == 3


def test_compile_in_order_without_cache_needs_no_barriers(monkeypatch):
    monkeypatch.delenv("SPMDNET_KERNEL_CACHE", raising=False)
    monkeypatch.setattr(_jit.socket, "gethostname", lambda: "b")
    comm = FakeComm(1, [("a", False, None), ("b", False, None)])
    assert _jit.compile_in_order(lambda: 5, comm) == 5 and comm.barriers == 0


def test_compile_in_order_rejects_ranks_that_disagree(monkeypatch):
    monkeypatch.delenv("SPMDNET_KERNEL_CACHE", raising=False)
    monkeypatch.setattr(_jit.socket, "gethostname", lambda: "a")
    comm = FakeComm(0, [("a", False, None), ("a", True, "/tmp/x")])
    with pytest.raises(sn.DistributedError, match="rank 1 has SPMDNET_KERNEL_CACHE=1"):
        _jit.compile_in_order(lambda: 5, comm)


def test_cache_dir_is_node_local_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv("SPMDNET_KERNEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path))
    assert _jit.cache_dir().startswith(str(tmp_path))
    monkeypatch.setenv("SPMDNET_KERNEL_CACHE_DIR", "/somewhere/else")
    assert os.path.dirname(_jit.cache_dir()) == "/somewhere/else"
    assert os.path.basename(_jit.cache_dir()).startswith("kernels-")  # sources' hash


_CACHE_SCRIPT = """
import numpy as np
from spmdnet.kernels import activation, _jit
activation.warmup(np.dtype(np.float32), ("relu",))
k = activation._cpu["relu", "backward"].compiled
print(sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))
"""


@pytest.mark.skipif(PLAIN_PYTHON, reason="nothing is compiled without the JIT")
def test_disk_cache_is_filled_once_then_loaded(tmp_path):
    env = dict(os.environ, SPMDNET_KERNEL_CACHE="1", SPMDNET_KERNEL_CACHE_DIR=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", _CACHE_SCRIPT], env=env, check=True,
                           capture_output=True, text=True, timeout=300).stdout.split()
            for _ in range(2)]
    assert runs[0] == ["0", "1"] and runs[1] == ["1", "0"], runs
    assert any(name.endswith(".nbi") for _, _, files in os.walk(tmp_path) for name in files)


# -- the same tests as plain Python and on the CUDA simulator --------------------------------
@pytest.mark.skipif(PLAIN_PYTHON or SIMULATOR, reason="this is that subprocess")
def test_plain_python_and_cuda_simulator():
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", NUMBA_ENABLE_CUDASIM="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__],
        env=env, capture_output=True, text=True, timeout=600,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
