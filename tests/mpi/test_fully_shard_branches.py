"""``fully_shard`` when a unit's forward takes a different branch on each
rank (its data decides): every rank starts the same reductions (no hang),
every rank's shard gets the mean over the ranks (against the serial model
run on each rank's rows with that rank's branch), a parameter no rank used
keeps ``.grad`` None; and the gradient collectives in "thread" mode (GPU
buffers) share one communication thread per communicator, stopped when the
model is gone."""
import gc
import threading
import time

import numpy as np
import pytest
import spmdnet as torch
import spmdnet.distributed as dist
from spmdnet import nn
from spmdnet.distributed import runtime
from spmdnet.distributed.fsdp import _fsdp_grads, fully_shard

from . import fully_shard_cases as C

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]

IN = D = 5  # the gate may read the input
OUT, ROWS = 3, 2


class Gate(nn.Module):
    """``lin2`` only where ``take`` (a rank-dependent choice)."""

    def __init__(self):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(D, D), nn.Linear(D, D)
        self.take = True

    def forward(self, x):
        h = torch.tanh(self.lin1(x))
        return self.lin2(h) if self.take else h


class Skip(nn.Module):
    """Its parameters only where ``take``: on the other ranks no gradient reaches the unit."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.take = True

    def forward(self, x):
        return self.lin(x) if self.take else x * 2


class Net(nn.Module):
    """``layout``: the units between an input layer (or none: the gate
    reads the input) and the output layer; ``never`` is used by no rank."""

    def __init__(self, layout):
        super().__init__()
        self.layout = layout
        if layout != "gate":
            self.embed, self.skip = nn.Linear(IN, D), Skip()
        if layout != "skip":
            self.gate = Gate()
        self.head, self.never = nn.Linear(D, OUT), nn.Linear(D, OUT)

    def forward(self, x):
        if self.layout == "gate":
            return self.head(self.gate(x))
        if self.layout == "skip":
            return self.head(self.skip(self.embed(x)))
        return self.head(self.skip(self.gate(self.embed(x))))

    def units(self):
        return [m for m in self.children() if isinstance(m, (Gate, Skip))]


def _choose(model, rank):
    for unit in model.units():
        unit.take = rank % (2 if isinstance(unit, Gate) else 3) == 0


def _models(layout):
    torch.manual_seed(0)
    model, serial = Net(layout), Net(layout)
    serial.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
    for unit in model.units():
        fully_shard(unit)
    fully_shard(model)
    _choose(model, dist.get_rank())
    return model, serial


def _serial_loss(serial, gx, gy):
    """The mean over the ranks of each rank's loss on its rows, with its branch."""
    size, total = dist.get_world_size(), 0
    for r in range(size):
        _choose(serial, r)
        rows = slice(r * ROWS, (r + 1) * ROWS)
        total = total + C.loss(serial, gx[rows], gy[rows])
    return total / size


def _check_pieces(model, serial):
    named = dict(serial.named_parameters())
    for name, p in model.named_parameters():
        ref = named[name].grad
        if ref is None:
            assert p.grad is None, name
            continue
        size, rank = p.device_mesh.size(0), p.device_mesh.get_coordinate()[0]
        piece = np.array_split(ref.array, [-(-ref.shape[0] // size) * r
                                           for r in range(1, size)])[rank]
        assert p.grad is not None, f"{name}: rank {rank} got no gradient"
        np.testing.assert_allclose(p.grad.array, piece, rtol=0, atol=1e-12, err_msg=name)


LAYOUTS = ["gate", "skip", "both"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rank_dependent_branches_reduce_on_every_rank_to_the_mean(layout):
    model, serial = _models(layout)
    gx, gy, x, y = C.batch(0, IN, OUT, ROWS)
    C.loss(model, x, y).backward()
    _serial_loss(serial, gx, gy).backward()
    assert serial.never.weight.grad is None
    _check_pieces(model, serial)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_training_with_rank_dependent_branches_matches_serial(layout):
    model, serial = _models(layout)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    ref = torch.optim.AdamW(serial.parameters(), lr=0.05)
    for step in range(3):
        gx, gy, x, y = C.batch(step, IN, OUT, ROWS)
        opt.zero_grad()
        C.loss(model, x, y).backward()
        opt.step()
        ref.zero_grad()
        _serial_loss(serial, gx, gy).backward()
        ref.step()
    C.assert_same_params(model, serial)


def _bucket_threads():
    return sum(t.name == "spmdnet-bucket-comm" for t in threading.enumerate())


def test_thread_mode_shares_one_thread_per_communicator_and_stops_it(monkeypatch):
    if not runtime.world().thread_multiple:
        pytest.skip("thread mode needs MPI_THREAD_MULTIPLE")
    before = _bucket_threads()
    monkeypatch.setattr(_fsdp_grads, "choose_mode", lambda overlap, on_gpu, tm: "thread")
    model, serial = C.models(lambda: C.Net(IN, D, OUT, [C.Block(D, 7) for _ in range(4)]))
    opt, ref = C.train(model, serial, 3, lambda s: C.batch(s, IN, OUT, ROWS))
    C.assert_same_params(model, serial)
    assert _bucket_threads() - before <= 1  # one mesh communicator: one thread
    del model, opt, ref
    gc.collect()
    deadline = time.monotonic() + 10
    while _bucket_threads() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _bucket_threads() == before


class _DueGate(nn.Module):
    """``lin`` on rank ``as_rank`` 0 only (None: this rank)."""

    def __init__(self):
        super().__init__()
        self.lin, self.as_rank = nn.Linear(4, 4), None

    def forward(self, x):
        rank = dist.get_rank() if self.as_rank is None else self.as_rank
        return self.lin(x) if rank == 0 else x * 2


class _DueNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.gate, self.out = nn.Linear(4, 4), _DueGate(), nn.Linear(4, 1)

    def forward(self, x):
        return self.out(self.gate(self.inp(x)))


def test_a_unit_no_gradient_reaches_on_some_ranks_still_reduces_everywhere():
    torch.manual_seed(0)
    model, serial = _DueNet(), _DueNet()
    serial.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
    fully_shard(model.gate)
    fully_shard(model)
    x = torch.randn(3, 4)  # the same rows on every rank
    model(x).sum().backward()
    size = dist.get_world_size()
    total = 0
    for r in range(size):
        serial.gate.as_rank = r
        total = total + serial(x).sum()
    (total / size).backward()
    _check_pieces(model, serial)
