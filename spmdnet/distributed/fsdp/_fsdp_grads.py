"""``fully_shard``'s gradient reduction: a unit's full gradients become its
shards' ``.grad``, through the one ``ParamAndGradBuffer`` of DataParallel,
ZeRO and FullyShardedDataParallel.

Each unit's buffer (``unit_buffer``) has one layout group per full-gradient
dtype (the reduce dtype, when the policy names one), laid out by
``ChunkLayout``: shard r holds every parameter's ``torch.chunk`` piece r
along its sharded dimension. The unit's post-backward (its gradients are
final) ``start``s the group's reduce-scatter over the shard group (or,
without gradient sync, ``collect``s the gradients into the buffer's storage,
where later backward passes add to them); the end of backward ``finish``es
it, so a unit's reduce-scatter travels while the earlier units run their
backward. On a 2-D (replicate, shard) mesh (HSDP) the received shard is then
all-reduced over the replicate group; the sum over all ranks is divided by
their number (``reductions.average``). ``PieceTargets`` then hands each
parameter its piece: cast to the shard's dtype, moved to where the shard
lives (the host under ``CPUOffloadPolicy``) and added into its ``.grad``
(accumulating, as ``.grad`` does). Every rank starts the same units'
reductions (``_fsdp_state`` decides from what every rank shares), zeros
where no gradient arrived on this rank, so a parameter that got a gradient
on some rank gets the mean on every rank, a rank whose forward did not
reach it included (as in DataParallel). Which did is agreed by a small
all-reduce started with the unit's reduction (``Votes``); a parameter no
rank's backward reached keeps its ``.grad`` (None stays None, as PyTorch).

All units' reductions over one communicator share one ``BucketComm``
(``channel``) on a duplicate of it (``runtime.dup``): their collectives
never interleave with the all-gathers on the mesh's communicator, and in
"thread" mode (GPU buffers) one communication thread per communicator runs
them in start order. ``release`` ends a user's hold; the thread stops when
none is left (and at exit).

The units' reductions in flight form one sequence per process, in start
order (``IN_FLIGHT``): polled from the gradient hooks (MPICH progresses
non-blocking collectives only inside MPI calls; a landed reduction's storage
is freed early) and finished in that order, stopping at the first not done,
so every rank starts the collectives that follow a reduce-scatter (HSDP's
all-reduce) in the same order.
"""
import atexit

import numpy as np

from ..._tensor import Tensor
from ...backend import device_of, is_cupy_array
from ...parallel._common.flat import ChunkLayout
from ...parallel._common.grad_buffer import ParamAndGradBuffer
from ...parallel._common.reductions import ReduceScatter
from .. import runtime
from ..bucket_collectives import BucketComm, choose_mode
from ._fsdp_storage import on_device


class Votes:
    """Which of a unit's trainable parameters got a gradient on some rank
    since the last delivery: this rank's (``pending``) summed over the mesh
    by an all-reduce started just before the unit's reduce-scatter (the same
    point on every rank), read when the reduction finishes. On HSDP the
    replicate group's sum follows, blocking, when it is read, on a channel
    of its own: the gradients' all-reduces after their reduce-scatters
    start when a poll finds those done, a moment that differs between ranks,
    so nothing else may start on their channel meanwhile."""

    def __init__(self, entries, bc, replicate):
        self.index = {id(e.full): i for i, e in enumerate(entries)}
        self.bc, self.replicate = bc, replicate
        self.pending, self.counts, self.work = set(), None, None

    def got(self, fulls):
        self.pending |= {id(f) for f in fulls if id(f) in self.index}

    def start(self):
        counts = np.zeros(len(self.index))
        counts[[self.index[k] for k in self.pending]] = 1
        self.pending, self.counts = set(), counts
        label = "allreduce(fully_shard: which parameters got gradients)"
        work = self.bc.all_reduce(counts, label)
        if self.replicate is not None:
            work = work.then(lambda: self.replicate.all_reduce(counts, label))
        self.work = work

    def reached(self, full):
        if self.work is not None:
            self.work.wait()
            self.work = None
        return self.counts[self.index[id(full)]] > 0


class PieceTargets:
    """Where one layout group's reduced shard goes: each of ``entries``'
    piece, into its shard's ``.grad`` when some rank's gradient reached it
    (``votes``); the pieces wait in ``held`` until the reduction finishes."""

    fresh = False  # the shard is received in the bucket's storage, then handed out

    def __init__(self, entries, layout, rank, votes):
        self.entries, self.layout, self.rank, self.votes = entries, layout, rank, votes
        self.lo = layout.shard_range(rank)[0]
        self.held = []

    def add(self, at, shard):
        for i, e in enumerate(self.entries):  # copies: the bucket's storage is handed back
            piece = on_device(self.layout.piece(shard, i, self.rank), device_of(e.shard.array))
            self.held.append((e, piece.astype(e.shard.array.dtype, order="C", copy=True)))

    def delivered(self):
        pass

    def finished(self):
        held, self.held = self.held, []
        for e, piece in held:
            if not self.votes.reached(e.full):
                continue
            if e.shard.grad is None:
                e.shard.grad = Tensor(piece)
            else:
                e.shard.grad.array += piece


class Channels:
    """One shared ``BucketComm`` per (communicator, mode), on a duplicate of
    the communicator made on first use (``dup`` is collective: every rank
    builds the same units in the same order). ``users`` counts the holds;
    at zero the communication thread stops (a later use starts it again)."""

    def __init__(self):
        self.comms, self.users = {}, {}

    def get(self, comm, mode):
        key = (id(comm), mode)
        if key not in self.comms:
            self.comms[key] = (comm, BucketComm(runtime.dup(comm), mode))
        self.users[key] = self.users.get(key, 0) + 1
        return self.comms[key][1]

    def release(self, bc):
        for key, (_, held) in self.comms.items():
            if held is bc:
                self.users[key] -= 1
                if self.users[key] <= 0:
                    bc.close()

    def close(self):
        for _, bc in self.comms.values():
            bc.close()


CHANNELS = Channels()
atexit.register(CHANNELS.close)


def check_reducible(dtype, what):
    if dtype.kind not in "fc":  # MPI sums no bfloat16
        raise TypeError(f"fully_shard: {what} would be reduced in {dtype}, which MPI cannot "
                        "sum; set MixedPrecisionPolicy(reduce_dtype=torch.float32)")


def unit_buffer(entries, names, shard_comm, replicate_comm, reduce_dtype):
    """The ``ParamAndGradBuffer`` of one unit's full parameters (``entries``
    with ``full`` built and trainable), its ``Votes`` and the shared
    ``BucketComm``s it holds (to ``CHANNELS.release``)."""
    parts, rank = shard_comm.Get_size(), shard_comm.Get_rank()
    size = parts  # the ranks whose gradients are averaged
    on_gpu = any(is_cupy_array(e.full.array) for e in entries)
    mode = choose_mode("auto", on_gpu, runtime.world().thread_multiple)
    by_dtype = {}
    for e, name in zip(entries, names):
        dtype = reduce_dtype if reduce_dtype is not None else e.full.array.dtype
        check_reducible(dtype, f"the gradient of {name}")
        by_dtype.setdefault(dtype, []).append((e, name))
    replicate = None
    if replicate_comm is not None and replicate_comm.Get_size() > 1:
        replicate = CHANNELS.get(replicate_comm, mode)
        size *= replicate_comm.Get_size()
    bc = CHANNELS.get(shard_comm, mode)
    votes = Votes(entries, bc, None if replicate is None else
                  CHANNELS.get(replicate_comm, "none"))
    groups, targets = [], {}
    for dtype, members in by_dtype.items():
        layout = ChunkLayout([e.full.array.shape for e, _ in members],
                             [e.dim for e, _ in members], parts, dtype)
        groups.append((dtype, [e.full for e, _ in members], layout))
        targets[dtype] = PieceTargets([e for e, _ in members], layout, rank, votes)
    reduction = ReduceScatter(size=size, label="fully_shard gradient", targets=targets,
                              then_allreduce=replicate)
    members = [m for ms in by_dtype.values() for m in ms]
    buffer = ParamAndGradBuffer(
        [e.full for e, _ in members], [n for _, n in members], shard_comm, who="fully_shard",
        reduction=reduction, groups=groups, bucket_mb=None, grads="transient", start="call",
        mode=mode, bc=bc)  # the channel all units share
    return buffer, votes, [c for c in (bc, replicate, votes.replicate) if c is not None]


class InFlight:
    """The unit buffers whose reductions started and have not finished, in
    start order (see the module docstring)."""

    def __init__(self):
        self.buffers = []

    def started(self, buffer):
        if buffer not in self.buffers:
            self.buffers.append(buffer)

    def poll(self):
        for buffer in self.buffers:
            buffer.progress()
            if any(b.started and not b.landed for b in buffer.buckets):
                return

    def finish_through(self, buffer):
        """Finish every buffer started before ``buffer``, then ``buffer``."""
        while buffer in self.buffers:
            self.buffers.pop(0).finish()

    def finish_all(self):
        while self.buffers:
            self.buffers.pop(0).finish()


IN_FLIGHT = InFlight()
