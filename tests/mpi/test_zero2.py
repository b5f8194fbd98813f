"""ZeRO-2 (``ZeroRedundancyOptimizer(stage=2)``) against serial training on
the global batch: same parameters, same optimizer state, gradient shards only."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
TINY_MB = 0.0002  # ~26 float64 values: many buckets, some across shard boundaries


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        sn.manual_seed(1)
        # 42 + 32 + 15 + 6 = 95 trainable values: uneven over 2, 3, 4 ranks
        self.body = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 4), nn.Tanh(),
                                  nn.Linear(4, 3))
        self.unused = nn.Linear(3, 2)  # gets no gradient: contributes zeros
        self.unused.bias.requires_grad = False  # frozen: not in the flat buffer

    def forward(self, x):
        return self.body(x)


def global_batch(step):
    rng = np.random.default_rng(step)
    return rng.standard_normal((4 * dist.size(), 5)), rng.integers(0, 3, 4 * dist.size())


def local(x, y):
    r = dist.rank()
    return x[4 * r:4 * r + 4], y[4 * r:4 * r + 4]


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def zero_unused_grads(model):
    """Unused parameters get zero gradients (what data parallelism gives them)."""
    for p in trainable(model):
        if p.grad is None:
            p.grad = np.zeros_like(p.array)


def assert_same_parameters(model, ref):
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_close(p.array, q.array)


def serial_step(model, opt, x, y, max_norm=None):
    """The oracle: one process, the global batch."""
    opt.zero_grad()
    F.cross_entropy(model(sn.tensor(x)), y).backward()
    zero_unused_grads(model)
    norm = optim.clip_grad_norm_(trainable(model), max_norm) if max_norm else None
    opt.step()
    return norm


def zero_step(model, zo, x, y, max_norm=None):
    zo.zero_grad()
    F.cross_entropy(model(sn.tensor(x)), y).backward()
    assert all(p.grad is None for p in model.parameters())  # only the shard is kept
    assert zo.grad_bytes() == zo.grad_shard.nbytes == 8 * -(-95 // dist.size())
    norm = zo.clip_grad_norm_(max_norm) if max_norm else None
    zo.step()
    return norm


def assert_close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("cls,kw", [(optim.AdamW, {"lr": 0.02, "weight_decay": 0.1}),
                                    (optim.SGD, {"lr": 0.1, "momentum": 0.9})])
@pytest.mark.parametrize("bucket_mb", [TINY_MB, 25.0])
def test_zero2_equals_serial(cls, kw, bucket_mb):
    ref, model = Net(), Net()
    ref_opt = cls(trainable(ref), **kw)
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, stage=2,
                                          bucket_mb=bucket_mb, **kw)
    assert len(zo.buffer.buckets) > (1 if bucket_mb == TINY_MB else 0)
    for step in range(4):
        x, y = global_batch(step)
        max_norm = 0.05 if step % 2 else None  # clipping bites: the norms are ~0.3
        norms = serial_step(ref, ref_opt, x, y, max_norm), zero_step(model, zo, *local(x, y),
                                                                     max_norm)
        if max_norm:
            assert_close(norms[1], norms[0])
            assert norms[0] > max_norm
        assert_same_parameters(model, ref)
    full, expected = zo.state_dict(), ref_opt.state_dict()
    assert full["param_groups"][0]["params"] == expected["param_groups"][0]["params"]
    for i, entries in expected["state"].items():
        for key, value in entries.items():
            assert_close(full["state"][i][key], value)
    zo.close()


def test_zero2_accumulates_gradients():
    ref, model = Net(), Net()
    ref_opt = optim.SGD(trainable(ref), lr=0.1, momentum=0.9)
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.SGD,
                                          stage=2, bucket_mb=TINY_MB, lr=0.1, momentum=0.9)
    for step in range(2):
        ref_opt.zero_grad()
        zo.zero_grad()
        for micro in range(2):  # two backward passes, one step: the gradients add up
            x, y = global_batch(10 * step + micro)
            F.cross_entropy(ref(sn.tensor(x)), y).backward()
            F.cross_entropy(model(sn.tensor(local(x, y)[0])), local(x, y)[1]).backward()
        zero_unused_grads(ref)
        ref_opt.step()
        zo.step()
        assert_same_parameters(model, ref)
    zo.close()


def test_zero2_checkpoint_resumes_like_uninterrupted():
    model = Net()
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.AdamW,
                                          stage=2, bucket_mb=TINY_MB, lr=0.01)
    for step in range(2):
        zero_step(model, zo, *local(*global_batch(step)))
    assert zo.state_bytes() == 2 * 8 * -(-95 // dist.size())  # two moments, one shard
    state, params = zo.state_dict(), model.state_dict()
    other = Net()
    other.load_state_dict(params)
    zo2 = parallel.ZeroRedundancyOptimizer(other.parameters(), optimizer_class=optim.AdamW,
                                           stage=2, lr=0.01)
    zo2.load_state_dict(state)
    for step in range(2, 4):
        batch = local(*global_batch(step))
        zero_step(model, zo, *batch)
        zero_step(other, zo2, *batch)
    for p, q in zip(model.parameters(), other.parameters()):
        np.testing.assert_array_equal(p.array, q.array)
    zo.close()
    zo2.close()


def rank0_alone_step(max_norm=None):
    """One ZeRO-2 step (clipped to ``max_norm`` when given) where only rank 0's
    backward reaches the parameters, against the serial step on its batch
    over P; the parameters must agree. Returns (ZeRO-2's norm, the serial norm)."""
    ref, model = Net(), Net()
    ref_opt = optim.SGD(trainable(ref), lr=0.1)
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.SGD,
                                          stage=2, bucket_mb=TINY_MB, lr=0.1)
    x, y = global_batch(0)
    zo.zero_grad()
    if dist.rank() == 0:
        F.cross_entropy(model(sn.tensor(x[:4])), y[:4]).backward()
    norm = zo.clip_grad_norm_(max_norm) if max_norm else None
    zo.step()
    ref_opt.zero_grad()
    (F.cross_entropy(ref(sn.tensor(x[:4])), y[:4]) / dist.size()).backward()
    zero_unused_grads(ref)
    want = nn.utils.clip_grad_norm_(trainable(ref), max_norm) if max_norm else None
    ref_opt.step()
    assert_same_parameters(model, ref)
    zo.close()
    return norm, want


def test_zero2_rank_without_gradient_joins_with_zeros():
    """A rank whose loss reaches no parameter still takes part (at step())."""
    rank0_alone_step()


def test_zero2_rank_without_gradient_joins_before_clipping():
    """Clipping is a collective too: a rank whose backward reached no
    parameter joins the reduce-scatter first (no deadlock), and the norm is
    the global one."""
    norm, want = rank0_alone_step(max_norm=0.05)
    np.testing.assert_allclose(norm, float(want), rtol=1e-12)


def test_zero2_refuses_data_parallel_and_bad_stage():
    model = Net()
    with pytest.raises(ValueError, match="stage must be 1 or 2"):
        parallel.ZeroRedundancyOptimizer(model.parameters(), stage=3)
    params = list(model.parameters())
    with pytest.raises(ValueError, match="appears more than once"):
        parallel.ZeroRedundancyOptimizer([{"params": params}, {"params": params[:1]}])
    with pytest.raises(ValueError, match="comm or process_group, not both"):
        parallel.ZeroRedundancyOptimizer(params, optim.Adam, process_group=dist.group.WORLD,
                                         comm=dist.comm_or_default(None))
    ddp = parallel.DataParallel(model)
    with pytest.raises(ValueError, match="do not wrap the model in DataParallel"):
        parallel.ZeroRedundancyOptimizer(model.parameters(), stage=2)
    ddp.close()


def no_decay_groups(model):
    """minGPT's groups: weight decay on matrices, none on biases."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in named if not n.endswith("bias")], "weight_decay": 0.1},
            {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0,
             "lr": 0.05}]


@pytest.mark.parametrize("stage", [1, 2])
def test_param_groups_equal_serial_and_round_trip(stage):
    ref, model = Net(), Net()
    ref_opt = optim.AdamW(no_decay_groups(ref), lr=0.02)
    zo = parallel.ZeroRedundancyOptimizer(no_decay_groups(model), optimizer_class=optim.AdamW,
                                          stage=stage, reduce_gradients=True,
                                          bucket_mb=TINY_MB, lr=0.02)
    assert [g["weight_decay"] for g in zo.param_groups] == [0.1, 0.0]
    for step in range(3):
        x, y = global_batch(step)
        serial_step(ref, ref_opt, x, y)
        zo.zero_grad()
        F.cross_entropy(model(sn.tensor(local(x, y)[0])), local(x, y)[1]).backward()
        zo.step()
        assert_same_parameters(model, ref)
    full, expected = zo.state_dict(), ref_opt.state_dict()
    assert [g["params"] for g in full["param_groups"]] == [
        g["params"] for g in expected["param_groups"]]
    assert [g["lr"] for g in full["param_groups"]] == [0.02, 0.05]
    for i, entries in expected["state"].items():
        for key, value in entries.items():
            assert_close(full["state"][i][key], value)
    other = Net()
    zo2 = parallel.ZeroRedundancyOptimizer(no_decay_groups(other), optimizer_class=optim.AdamW,
                                           stage=stage, reduce_gradients=True, lr=0.02)
    zo2.load_state_dict(full)
    for a, b in zip(zo.shard_params, zo2.shard_params):
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(zo2.optim.state[b][key], zo.optim.state[a][key])
    zo.close()
    zo2.close()


def test_buckets_start_during_backward_and_free_their_staging():
    model = Net().body  # every parameter gets a gradient
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.SGD,
                                          stage=2, bucket_mb=TINY_MB, lr=0.1)
    x, y = local(*global_batch(0))
    F.cross_entropy(model(sn.tensor(x)), y).backward()
    buckets = zo.buffer.buckets
    assert len(buckets) >= 3 and zo.buffer.started_early == len(buckets)
    assert all(b.buffer is None and b.work is None for b in buckets)
    assert zo.grad_bytes() == zo.grad_shard.nbytes == 8 * -(-89 // dist.size())
    zo.step()
    zo.close()
