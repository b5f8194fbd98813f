"""FSDP's overlapped communication: non-blocking gradient reduce-scatters and
prefetched all-gathers equal serial training; the state can be taken between
forward and backward; every collective passes through the guard.

Runs at any number of ranks (CI: 1 to 4), float64.
"""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel
from spmdnet.distributed import bucket_collectives, guard

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]

D, B = 6, 3  # width, batch per rank; unit sizes (6*13+13+13*6+6+12 = 187) divide by no N > 1


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.fc = nn.Linear(D, 2 * D + 1)
        self.out = nn.Linear(2 * D + 1, D)

    def forward(self, x):
        return x + self.out(F.gelu(self.fc(self.norm(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, D)
        self.blocks = nn.Sequential(Block(), Block(), Block())
        self.head = nn.Linear(D, 3)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))


def net():
    sn.manual_seed(5)
    return Net()


def make(reshard=True, overlap=True, prefetch=True):
    return parallel.FullyShardedDataParallel(net(), wrap={Block}, reshard_after_forward=reshard,
                                             overlap=overlap, prefetch=prefetch)


def batch(step):
    rng = np.random.default_rng(step)
    n = B * dist.size()
    x, y = rng.standard_normal((n, 4)), rng.integers(0, 3, n)
    r = dist.rank()
    return (x, y), (x[B * r:B * (r + 1)], y[B * r:B * (r + 1)])


def loss(model, x, y):
    return F.cross_entropy(model(sn.tensor(x)), y)


def backward_both(fsdp, ref, opts, step):
    """The serial model's whole step on the global batch; FSDP's zero_grad,
    forward and backward on the local batch (its optimizer step is left to
    the caller)."""
    (x, y), (lx, ly) = batch(step)
    opt, ref_opt = opts
    ref_opt.zero_grad()
    loss(ref, x, y).backward()
    ref_opt.step()
    opt.zero_grad()
    loss(fsdp, lx, ly).backward()


def assert_close(state, expected, tol=1e-12):
    assert list(state) == list(expected)
    for k in expected:
        np.testing.assert_allclose(state[k], expected[k], rtol=tol, atol=tol, err_msg=k)


def in_flight(fsdp):
    """The gradient buckets whose non-blocking reduce-scatter is started and not waited for."""
    return sum(b.work is not None and b.work.request is not None for b in fsdp.buffer.buckets)


def watch_buffer(fsdp):
    """Record the reduce-scatters in flight after each start and at each poll."""
    seen = {"max_started": 0, "polled_in_flight": 0}
    start, poke = fsdp.buffer.start, fsdp.poke

    def started(buckets):
        start(buckets)
        seen["max_started"] = max(seen["max_started"], in_flight(fsdp))

    def polled():
        seen["polled_in_flight"] += bool(in_flight(fsdp))
        poke()
    fsdp.buffer.start, fsdp.poke = started, polled
    return seen


@pytest.mark.parametrize("reshard", [True, False])
@pytest.mark.parametrize("overlap", [True, False])
def test_overlapped_reduce_scatters_equal_serial(reshard, overlap):
    fsdp, ref = make(reshard, overlap), net()
    seen = watch_buffer(fsdp)
    opts = [optim.AdamW(m.parameters(), lr=0.02, weight_decay=0.1) for m in (fsdp, ref)]
    for step in range(3):
        backward_both(fsdp, ref, opts, step)
        # all finished before backward returned, their storage back in the pool
        assert in_flight(fsdp) == 0 and fsdp.buffer.staged_bytes() == 0
        assert all(p.grad is not None for p in fsdp.parameters())
        opts[0].step()
        assert_close(fsdp.state_dict(), ref.state_dict())
    # recomputed units: one unit's gradient in flight at a time; kept units
    # (all held until backward ends anyway) are all started, then completed
    most = 1 if reshard else len(fsdp.flats())
    assert seen["max_started"] == (most if overlap else 0)
    # a reduce-scatter was polled while a later unit's backward ran
    assert (seen["polled_in_flight"] > 0) == (overlap and reshard)
    fsdp.close()


@pytest.mark.parametrize("reshard", [True, False])
def test_state_between_forward_and_backward(reshard):
    plain, probed = make(reshard), make(reshard)
    opts = [optim.AdamW(m.parameters(), lr=0.02) for m in (plain, probed)]
    for step in range(3):
        _, (x, y) = batch(step)
        for model, opt in zip((plain, probed), opts):
            opt.zero_grad()
            before = model.state_dict()
            out = loss(model, x, y)
            if model is probed:
                assert_close(model.state_dict(), before, tol=0)
                rank0 = model.state_dict(rank0_only=True)
                assert (rank0 == {}) == (dist.rank() != 0)
                model.sharded_state_dict()
                model.optim_state_dict(opt)
                with pytest.raises(RuntimeError, match="between forward and backward"):
                    model.load_state_dict(before)
            out.backward()
            opt.step()
        assert_close(probed.state_dict(), plain.state_dict(), tol=0)
    probed.load_state_dict(plain.state_dict())  # after backward: allowed again
    for model in (plain, probed):
        model.close()


class RecordingComm:
    """A communicator that notes every raw call: blocking collectives must run
    inside ``dist.guarded``; non-blocking starts are counted."""

    BLOCKING = {"Allgather", "allgather", "Allreduce", "allreduce", "Reduce_scatter_block",
                "Reduce_scatter", "Bcast", "bcast", "Barrier", "barrier"}
    NONBLOCKING = {"Iallgather", "Iallreduce", "Ireduce_scatter_block", "Ireduce_scatter",
                   "Ibcast", "Ibarrier"}

    def __init__(self, comm):
        self.comm, self.unguarded, self.started = comm, [], 0

    def __getattr__(self, name):
        attr = getattr(self.comm, name)
        if name in self.BLOCKING:
            def blocking(*args, **kwargs):
                if guard.state["pending"] is None:
                    self.unguarded.append(name)
                return attr(*args, **kwargs)
            return blocking
        if name in self.NONBLOCKING:
            def nonblocking(*args, **kwargs):
                self.started += 1
                return attr(*args, **kwargs)
            return nonblocking
        return attr


@pytest.fixture
def check_mode(monkeypatch):
    monkeypatch.setenv("SPMDNET_DEBUG_COLLECTIVES", "1")
    guard.configure()
    yield
    monkeypatch.delenv("SPMDNET_DEBUG_COLLECTIVES")
    guard.configure()


def test_every_collective_is_guarded_in_check_mode(check_mode, monkeypatch):
    fsdp, ref = make(), net()
    real = fsdp.comm
    rec = RecordingComm(real)
    holders = [fsdp, *fsdp.flats()] + [h.bc for h in [fsdp.prefetcher, fsdp.buffer,
                                                       *fsdp.flats()]]
    for holder in holders:
        holder.comm = rec
    waits = []
    guarded = dist.guarded

    def counting(op, comm, *args, **kwargs):
        if comm is rec and ("FSDP prefetch" in op or "FSDP gradient" in op):
            waits.append(op)
        return guarded(op, comm, *args, **kwargs)
    monkeypatch.setattr(dist, "guarded", counting)
    monkeypatch.setattr(bucket_collectives, "guarded", counting)
    opts = [optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (fsdp, ref)]
    for step in range(3):
        backward_both(fsdp, ref, opts, step)
        fsdp.clip_grad_norm_(1e9)
        opts[0].step()
    state = fsdp.state_dict()
    fsdp.optim_state_dict(opts[0])
    assert rec.unguarded == []
    assert rec.started == len(waits)  # every non-blocking request completed under the guard
    assert rec.started > 0  # the gradients' reduce-scatters at least
    for holder in holders:
        holder.comm = real
    assert_close(state, ref.state_dict())
    fsdp.close()


class Table(nn.Module):
    """A unit whose output is a view of its own parameter."""

    def __init__(self):
        super().__init__()
        self.rows = nn.Parameter(sn.randn(3, D).array)

    def forward(self, x):
        return self.rows[1]  # broadcast over the batch


class TableNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, D)
        self.first, self.second = Table(), Table()  # equal sizes: they share pooled buffers
        self.head = nn.Linear(D, 3)

    def forward(self, x):
        h = self.embed(x)
        return self.head(h + self.first(h) * self.second(h))


@pytest.mark.parametrize("reshard", [True, False])
def test_outputs_that_view_parameters_survive_buffer_reuse(reshard):
    sn.manual_seed(2)
    ref = TableNet()
    sn.manual_seed(2)
    fsdp = parallel.FullyShardedDataParallel(TableNet(), wrap={Table},
                                             reshard_after_forward=reshard)
    opts = [optim.SGD(m.parameters(), lr=0.1) for m in (fsdp, ref)]
    for step in range(3):
        backward_both(fsdp, ref, opts, step)
        opts[0].step()
        assert_close(fsdp.state_dict(), ref.state_dict())
    _, (x, _) = batch(9)
    with sn.no_grad():
        for _ in range(2):
            np.testing.assert_allclose(fsdp(sn.tensor(x)).array, ref(sn.tensor(x)).array,
                                       rtol=1e-12, atol=1e-12)
    fsdp.close()
