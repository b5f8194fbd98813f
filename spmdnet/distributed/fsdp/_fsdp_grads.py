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
(accumulating, as ``.grad`` does). A parameter that got no gradient keeps
its ``.grad``.

The units' reductions in flight form one sequence per process, in start
order (``IN_FLIGHT``): polled from the gradient hooks (MPICH progresses
non-blocking collectives only inside MPI calls; a landed reduction's storage
is freed early) and finished in that order, stopping at the first not done,
so every rank starts the collectives that follow a reduce-scatter (HSDP's
all-reduce) in the same order.
"""
from ..._tensor import Tensor
from ...backend import device_of, is_cupy_array
from ...parallel._common.flat import ChunkLayout
from ...parallel._common.grad_buffer import ParamAndGradBuffer
from ...parallel._common.reductions import ReduceScatter
from .. import runtime
from ..bucket_collectives import BucketComm, choose_mode
from ._fsdp_storage import on_device


class PieceTargets:
    """Where one layout group's reduced shard goes: each of ``entries``'
    piece, into its shard's ``.grad``. ``pending``: ids of the full
    Parameters that had a gradient since the last delivery."""

    fresh = False  # the shard is received in the bucket's storage, then handed out

    def __init__(self, entries, layout, rank):
        self.entries, self.layout, self.rank = entries, layout, rank
        self.lo = layout.shard_range(rank)[0]
        self.pending = set()

    def add(self, at, shard):
        for i, e in enumerate(self.entries):
            if id(e.full) not in self.pending:
                continue
            piece = on_device(self.layout.piece(shard, i, self.rank), device_of(e.shard.array))
            if e.shard.grad is None:  # a copy: the bucket's storage is handed back
                e.shard.grad = Tensor(piece.astype(e.shard.array.dtype, order="C"))
            else:
                e.shard.grad.array += piece

    def delivered(self):
        pass

    def finished(self):
        self.pending = set()


def check_reducible(dtype, what):
    if dtype.kind not in "fc":  # MPI sums no bfloat16
        raise TypeError(f"fully_shard: {what} would be reduced in {dtype}, which MPI cannot "
                        "sum; set MixedPrecisionPolicy(reduce_dtype=torch.float32)")


def unit_buffer(entries, names, shard_comm, replicate_comm, reduce_dtype):
    """The ``ParamAndGradBuffer`` of one unit's full parameters (``entries``
    with ``full`` built and trainable) and its targets ``{key: PieceTargets}``."""
    size, rank = shard_comm.Get_size(), shard_comm.Get_rank()
    on_gpu = any(is_cupy_array(e.full.array) for e in entries)
    mode = choose_mode("auto", on_gpu, runtime.world().thread_multiple)
    by_dtype = {}
    for e, name in zip(entries, names):
        dtype = reduce_dtype if reduce_dtype is not None else e.full.array.dtype
        check_reducible(dtype, f"the gradient of {name}")
        by_dtype.setdefault(dtype, []).append((e, name))
    groups, targets = [], {}
    for dtype, members in by_dtype.items():
        layout = ChunkLayout([e.full.array.shape for e, _ in members],
                             [e.dim for e, _ in members], size, dtype)
        groups.append((dtype, [e.full for e, _ in members], layout))
        targets[dtype] = PieceTargets([e for e, _ in members], layout, rank)
    replicate = None
    if replicate_comm is not None and replicate_comm.Get_size() > 1:
        replicate = BucketComm(replicate_comm, mode)
        size *= replicate_comm.Get_size()
    reduction = ReduceScatter(size=size, label="fully_shard gradient", targets=targets,
                              then_allreduce=replicate)
    members = [m for ms in by_dtype.values() for m in ms]
    buffer = ParamAndGradBuffer(
        [e.full for e, _ in members], [n for _, n in members], shard_comm, who="fully_shard",
        reduction=reduction, groups=groups, bucket_mb=None, grads="transient", start="call",
        mode=mode)
    return buffer, targets, replicate


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


IN_FLIGHT = InFlight()
