"""FSDP's gradients go through the one ``ParamAndGradBuffer``: each unit's
bucket starts during backward, while the next unit recomputes; ``no_sync``
accumulation, a unit called twice, and the mean (one rule for DataParallel,
ZeRO-2 and FSDP) against the serial model.

Runs at any number of ranks (CI: 1 to 4), float64.
"""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]

D, B = 5, 2  # width, batch per rank


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        return x + F.gelu(self.fc(x))


class Net(nn.Module):
    def __init__(self, repeat=False):
        super().__init__()
        self.embed = nn.Linear(3, D)
        self.blocks = nn.ModuleList([Block(), Block(), Block()])
        self.head = nn.Linear(D, 2)
        self.repeat = repeat

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        if self.repeat:  # the last block once more: its unit runs twice per step
            h = self.blocks[2](h)
        return self.head(h)


def net(repeat=False):
    sn.manual_seed(4)
    return Net(repeat)


def batch(step):
    rng = np.random.default_rng(100 + step)
    n = B * dist.size()
    x, y = rng.standard_normal((n, 3)), rng.integers(0, 2, n)
    r = dist.rank()
    return (x, y), (x[B * r:B * (r + 1)], y[B * r:B * (r + 1)])


def full_grads(fsdp):
    """{parameter name: its full gradient}, gathered from the shards' ``.grad``."""
    out = {}
    for f in fsdp.flats():
        full = f.allgather(f.shard.grad.array)
        out.update(zip(f.names, (v.copy() for v in f.layout.views(full))))
    return out


def assert_grads(fsdp, ref, tol=1e-12):
    got = full_grads(fsdp)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(got[name], p.grad.array, rtol=tol, atol=tol, err_msg=name)


def loss(model, x, y):
    return F.cross_entropy(model(sn.tensor(x)), y)


@pytest.mark.parametrize("reshard", [True, False])
def test_unit_buckets_start_during_backward_and_overlap_the_next_unit(reshard):
    fsdp, ref = parallel.FullyShardedDataParallel(net(), wrap={Block},
                                                  reshard_after_forward=reshard), net()
    buffer = fsdp.buffer
    block_flats = [f for u in fsdp.units if u.recompute for f in u.flats]
    starts = []  # per start: (its flats, finish pending, earlier buckets still travelling)
    start = buffer.start

    def recorded(buckets):
        buckets = list(buckets)
        travelling = sum(b.work is not None and b.work.request is not None
                         for b in buffer.buckets)
        starts.append(([b.key for b in buckets], fsdp._finish_scheduled, travelling))
        start(buckets)
    buffer.start = recorded
    for step in range(2):
        (x, y), (lx, ly) = batch(step)
        starts.clear()
        ref.zero_grad()
        loss(ref, x, y).backward()
        loss(fsdp, lx, ly).backward()
        assert_grads(fsdp, ref)
        assert buffer.reductions == step + 1 and buffer.staged_bytes() == 0
        for p in fsdp.parameters():
            p.grad = None
        if not reshard:  # every unit kept: all start together when backward ends
            assert len(starts) == 1 and len(starts[0][0]) == len(fsdp.flats())
            assert not starts[0][1]
            continue
        # one bucket per block, started at the block's backward end (reverse
        # order, backward still running), then the root's when it ends
        assert [keys for keys, _, _ in starts] == [[f] for f in reversed(block_flats)] + [
            [f for u in fsdp.units if not u.recompute for f in u.flats]]
        assert [pending for _, pending, _ in starts] == [True, True, True, False]
        # a block's reduce-scatter was still travelling when the block before
        # it had recomputed and backpropagated: it overlapped that compute
        assert [travelling for _, _, travelling in starts[1:3]] == [1, 1]
    fsdp.close()


@pytest.mark.parametrize("reshard", [True, False])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_no_sync_accumulates_in_the_buckets_as_the_serial_model(reshard, set_to_none):
    fsdp, ref = parallel.FullyShardedDataParallel(net(), wrap={Block},
                                                  reshard_after_forward=reshard), net()
    opts = [optim.SGD(m.parameters(), lr=0.1) for m in (fsdp, ref)]
    for step in range(2):
        for opt in opts:
            opt.zero_grad(set_to_none=set_to_none)
        for micro in range(3):
            (x, y), (lx, ly) = batch(3 * step + micro)
            loss(ref, x, y).backward()
            if micro < 2:
                with fsdp.no_sync():
                    loss(fsdp, lx, ly).backward()
                # the local sums wait in the gradient buckets: nothing reduced yet
                assert fsdp.buffer.staged_bytes() == sum(
                    f.layout.padded_numel * 8 for f in fsdp.flats())
                none = all(p.grad is None for p in fsdp.parameters())
                assert none == (set_to_none or step == 0)
            else:
                loss(fsdp, lx, ly).backward()
        assert fsdp.buffer.staged_bytes() == 0
        assert_grads(fsdp, ref)
        for opt in opts:
            opt.step()
    fsdp.close()


def test_a_unit_called_twice_reduces_both_calls():
    fsdp, ref = parallel.FullyShardedDataParallel(net(repeat=True), wrap={Block}), net(True)
    for step in range(2):
        (x, y), (lx, ly) = batch(step)
        ref.zero_grad()
        for p in fsdp.parameters():
            p.grad = None
        loss(ref, x, y).backward()
        loss(fsdp, lx, ly).backward()
        assert_grads(fsdp, ref)
    fsdp.close()


def test_one_mean_rule_for_data_parallel_zero_and_fsdp():
    """Integer gradients sum exactly; their mean is sum / N, correctly rounded
    (at 3 ranks ``sum * (1/3)`` differs in the last bit for some sums)."""
    size, rank = dist.size(), dist.rank()
    c = np.arange(1.0, 41.0)
    sums = c * sum(r * r + 1 for r in range(size))  # d loss / d w_k = c_k * (r*r + 1)
    expected = sums / size

    def layer():
        return nn.Linear(1, c.size, bias=False)  # d/dW does not depend on W

    def backward(model):
        (model(sn.tensor(np.array([[rank * rank + 1.0]]))) * sn.tensor(c)).sum().backward()

    ddp = parallel.DataParallel(layer())
    backward(ddp)
    np.testing.assert_array_equal(ddp.module.weight.grad.array.ravel(), expected)
    ddp.close()

    model = layer()
    zo = parallel.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.SGD,
                                          stage=2, lr=0.1)
    backward(model)
    full = dist.allgather(zo.grad_shard, comm=zo.comm).reshape(-1)
    np.testing.assert_array_equal(full[:c.size], expected)
    zo.close()

    fsdp = parallel.FullyShardedDataParallel(layer())
    backward(fsdp)
    np.testing.assert_array_equal(full_grads(fsdp)["weight"].ravel(), expected)
    fsdp.close()
