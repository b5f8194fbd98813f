"""FullyShardedDataParallel's ``cpu_offload`` and ``mixed_precision`` against
an independent oracle: the same model run without them, or the serial model
run in the low precision on every rank's batch, its gradients averaged."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import dist, nn, optim, parallel
from spmdnet.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]

B = 3  # batch per rank


def make_model(dtype=None):
    sn.manual_seed(7)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.BatchNorm1d(6), nn.Linear(6, 5),
                          nn.GELU(), nn.Linear(5, 3))
    return model if dtype is None else model.to(dtype)


def batch(rank, step=0):
    rng = np.random.default_rng(100 * step + rank)
    return rng.standard_normal((B, 4)), rng.integers(0, 3, B)


def fsdp_of(**kw):
    return parallel.FullyShardedDataParallel(make_model(), wrap={nn.Linear}, **kw)


def step(fsdp, n=0):
    x, y = batch(dist.rank(), n)
    out = fsdp(sn.tensor(x, requires_grad=True))
    F.cross_entropy(out, y).backward()
    return out


def full_grads(fsdp):
    """{parameter name: its full gradient}, from every rank's shard gradient."""
    grads = {}
    for f in fsdp.flats():
        flat = dist.allgather(np.ascontiguousarray(f.shard.grad.array), comm=fsdp.comm)
        for name, view in zip(f.names, f.layout.views(flat.reshape(-1))):
            grads[name] = view.copy()
    return grads


def serial_grads(dtype):
    """The mean over the ranks' batches of the serial model's gradients, run
    in ``dtype`` (each rank's batch cast to it)."""
    model, total = make_model(dtype), {}
    for r in range(dist.size()):
        model.zero_grad()
        x, y = batch(r)
        F.cross_entropy(model(sn.tensor(x.astype(dtype))), y).backward()
        for name, p in model.named_parameters():
            total[name] = total.get(name, 0) + p.grad.array
    return {k: v / dtype(dist.size()) for k, v in total.items()}


def test_cpu_offload_gives_the_same_numbers_with_host_shards():
    plain, off = fsdp_of(), fsdp_of(cpu_offload=CPUOffload(offload_params=True))
    opts = [optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (plain, off)]
    for n in range(2):
        for m, opt in zip((plain, off), opts):
            opt.zero_grad()
            step(m, n)
            opt.step()
    for p, q in zip(plain.parameters(), off.parameters()):
        assert type(q.array) is np.ndarray and type(q.grad.array) is np.ndarray
        np.testing.assert_array_equal(q.array, p.array)
        np.testing.assert_array_equal(q.grad.array, p.grad.array)
    assert off.offload and not plain.offload
    plain.close()
    off.close()


def test_param_dtype_float64_over_float64_is_the_plain_run():
    plain, mp = fsdp_of(), fsdp_of(mixed_precision=MixedPrecision(param_dtype=sn.float64))
    outs = [step(m) for m in (plain, mp)]
    np.testing.assert_array_equal(outs[1].numpy(), outs[0].numpy())
    for p, q in zip(plain.parameters(), mp.parameters()):
        np.testing.assert_array_equal(q.grad.array, p.grad.array)
    plain.close()
    mp.close()


def test_param_dtype_float32_gives_the_float32_serial_gradients_upcast():
    seen = []
    fsdp = fsdp_of(mixed_precision=MixedPrecision(param_dtype=sn.float32), forward_prefetch=True)
    fsdp.module[3].register_forward_pre_hook(lambda m, a: seen.append((m.weight.dtype, a[0].dtype)))
    out = step(fsdp)
    assert out.dtype == np.float32 and seen == [(np.float32, np.float32)]
    assert all(b.dtype == np.float32 for b in fsdp.buffer.buckets)  # reduce_dtype: param_dtype
    got, want, exact = full_grads(fsdp), serial_grads(np.float32), serial_grads(np.float64)
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == np.float64  # upcast to the shard's dtype
        np.testing.assert_allclose(got[name], want[name], rtol=2e-6, atol=1e-7, err_msg=name)
    # computed in float32 indeed: off the float64 gradients by float32 rounding
    worst = max(np.abs(got[k] - exact[k]).max() for k in exact)
    assert 1e-12 < worst < 1e-5
    assert all(p.array.dtype == np.float64 for p in fsdp.parameters())  # shards: full precision
    plain = fsdp_of()
    step(plain)  # the same running statistics, to float32 rounding
    for (k, v), (k2, w) in zip(fsdp.state_dict().items(), plain.state_dict().items()):
        assert k == k2 and v.dtype == w.dtype  # the full-precision state
        np.testing.assert_allclose(v.numpy(), w.numpy(), rtol=1e-6, atol=1e-7, err_msg=k)
        if "running" not in k:  # the parameters: exactly the full-precision shards
            np.testing.assert_array_equal(v.numpy(), w.numpy(), err_msg=k)
    plain.close()
    fsdp.close()
    assert all(p.dtype == np.float64 for p in fsdp.module.parameters())


@pytest.mark.parametrize("reduce, keep", [(np.float64, False), (np.float16, True),
                                          (np.float32, True)])
def test_reduce_dtype_is_the_buckets_and_keep_low_precision_grads(reduce, keep):
    fsdp = fsdp_of(mixed_precision=MixedPrecision(param_dtype=sn.float32, reduce_dtype=reduce,
                                                  keep_low_precision_grads=keep))
    step(fsdp)
    assert {b.dtype for b in fsdp.buffer.buckets} == {np.dtype(reduce)}
    grad_dtype = np.dtype(reduce) if keep else np.dtype(np.float64)
    assert all(p.grad.dtype == grad_dtype for p in fsdp.parameters())
    want, got = serial_grads(np.float32), full_grads(fsdp)
    tol = 2e-3 if reduce is np.float16 else 2e-6
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol / 10, err_msg=name)
    fsdp.close()


def test_bfloat16_params_gather_in_bfloat16_and_reduce_in_float32_buckets():
    seen = []
    fsdp = fsdp_of(mixed_precision=MixedPrecision(param_dtype=sn.bfloat16), forward_prefetch=True)
    fsdp.module[0].register_forward_pre_hook(lambda m, a: seen.append(m.weight.dtype))
    out = step(fsdp)
    assert out.dtype == sn.bfloat16 and seen == [sn.bfloat16]
    assert {b.dtype for b in fsdp.buffer.buckets} == {np.dtype(np.float32)}
    got, exact = full_grads(fsdp), serial_grads(np.float64)
    for name in exact:  # the bfloat16 sum: 8 bits of mantissa
        np.testing.assert_allclose(got[name], exact[name], rtol=0.1, atol=0.02, err_msg=name)
        # rounded to bfloat16 after the reduction
        np.testing.assert_array_equal(got[name], got[name].astype(sn.bfloat16).astype(np.float64))
    fsdp.close()


def test_buffer_dtype_and_the_cast_of_forward_inputs():
    seen = []
    fsdp = fsdp_of(mixed_precision=MixedPrecision(
        param_dtype=sn.float32, buffer_dtype=sn.float32, cast_forward_inputs=True,
        cast_root_forward_inputs=False))
    bn = fsdp.module[2]
    assert bn.running_mean.dtype == np.float32 and bn.running_var.dtype == np.float32
    fsdp.module[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].dtype))
    x, y = batch(dist.rank())
    xt = sn.tensor(x, requires_grad=True)
    F.cross_entropy(fsdp(xt), y).backward()
    assert seen == [np.float32]  # cast by the unit, not the root
    assert xt.grad.dtype == np.float64  # the cast is in the graph
    state = fsdp.state_dict()  # as PyTorch's: the buffers in their own dtype
    assert state["2.running_mean"].dtype == np.float64 and bn.running_mean.dtype == np.float32
    np.testing.assert_array_equal(state["2.running_mean"].numpy(), bn.running_mean.numpy())
    fsdp.close()


def test_wrong_configurations_raise():
    with pytest.raises(TypeError, match="param_dtype"):
        fsdp_of(mixed_precision=MixedPrecision(param_dtype=np.int32))
    with pytest.raises(TypeError, match="cpu_offload"):
        fsdp_of(cpu_offload=True)
    with pytest.raises(NotImplementedError, match="NO_SHARD"):
        parallel.FullyShardedDataParallel(
            make_model(), sharding_strategy=ShardingStrategy.NO_SHARD,
            mixed_precision=MixedPrecision(param_dtype=sn.float32))
