"""What a ``ParamAndGradBuffer`` does with a full gradient bucket: the
collective it starts and how the result lands (the mean over the ranks).

- ``AllReduce`` (DataParallel): every rank gets the bucket's mean, in place.
- ``ReduceScatter`` (ZeRO-2, FSDP): rank r gets the mean of the part of the
  bucket inside its shard r of the bucket's padded layout, into (or added
  to) that layout's gradient shard (a ``ShardTarget``: ZeRO's one gradient
  shard array, ``ParamShardTarget``: an FSDP shard Parameter's ``.grad``,
  or the caller's own target: ``fully_shard``'s per-parameter pieces).
  ``then_allreduce`` (HSDP): a second stage, the received part summed over
  another group of ranks (``size`` then counts the ranks of both).
A reduction is the buffer's comm hook: ``start(bc, bucket)`` returns the
started ``bucket_collectives.Work``; ``land(bucket)`` runs once it is done;
``finished()`` after each backward.

The mean is one rule everywhere (``average``): the sum over the ranks, then
divided by their number (the serial oracle's ``sum / N``, correctly rounded;
multiplying by ``1 / N`` differs in the last bit for N = 3).
"""
from ..._tensor import Tensor
from ...backend import xp_of


def average(array, size):
    """The sum over ``size`` ranks in ``array`` made their mean, in place."""
    if size > 1 and array.dtype.kind in "fc":
        array /= size


class AllReduce:
    def __init__(self, size):
        self.size = size

    def start(self, bc, bucket):
        return bc.all_reduce(bucket.buffer, f"allreduce(gradient bucket {bucket.index})")

    def land(self, bucket):
        average(bucket.buffer, self.size)

    def finished(self):
        pass


class _Target:
    """A gradient shard target's addition of a reduced piece at ``at``."""

    def add(self, at, piece):
        self.array[at:at + piece.size] += piece


class ShardTarget(_Target):
    """This rank's gradient shard of a layout: ``array``, positions
    ``[lo, lo + array.size)`` of it. ``fresh``: it holds no gradient yet
    (after ``zero_grad``), so a reduction is received straight into it;
    otherwise it is added (gradient accumulation). Fresh again only when
    its owner says so: after a backward's reduction it is not."""

    def __init__(self, array, lo):
        self.array, self.lo, self.fresh = array, lo, True

    def receive_into(self):
        return self.array

    def delivered(self):
        pass

    def finished(self):
        self.fresh = False


class ParamShardTarget(_Target):
    """The ``.grad`` of a shard Parameter covering ``[lo, lo + numel)``:
    fresh while it is None; the first reduction then receives into a new
    zero array (the padding stays zero) that becomes the ``.grad``."""

    def __init__(self, param, lo):
        self.param, self.lo, self._new = param, lo, None

    @property
    def fresh(self):
        return self.param.grad is None

    @property
    def array(self):
        return self.param.grad.array

    def receive_into(self):
        if self._new is None:
            shard = self.param.array
            self._new = xp_of(shard).zeros(shard.size, shard.dtype)
        return self._new

    def delivered(self):
        if self.param.grad is None:
            self.param.grad = Tensor(self._new)

    def finished(self):
        self._new = None


class ReduceScatter:
    """Into ``shard`` (this rank's gradient shard array, covering
    ``[lo, lo + len)`` of every bucket's layout: ZeRO-2, ``fresh`` after its
    ``zero_grad``), or with ``targets`` (``{layout key: target}``, one per
    layout group: FSDP) into the bucket's layout's target (one with
    ``fresh``, ``lo``, ``receive_into``, ``add(at, piece)``, ``delivered``
    and ``finished``). The bucket's storage is transient: a reduction to be
    added lands in place in it. ``then_allreduce``: a ``BucketComm`` whose
    ranks then sum the received part (see the module docstring)."""

    def __init__(self, shard=None, lo=0, size=1, label="ZeRO-2 gradient bucket", targets=None,
                 then_allreduce=None):
        self.size, self.label, self.then = size, label, then_allreduce
        self._one = None if targets is not None else ShardTarget(shard, lo)
        self.targets = targets if targets is not None else {}
        self._received = {}  # bucket index -> (target, offset in the shard, length, recv)

    @property
    def fresh(self):
        return self._one.fresh

    @fresh.setter
    def fresh(self, value):
        self._one.fresh = value

    def start(self, bc, bucket):
        layout = bucket.layout
        target = self._one or self.targets[bucket.key]
        lo = target.lo
        counts = [max(0, min(bucket.stop, hi) - max(bucket.start, a))
                  for a, hi in map(layout.shard_range, range(layout.parts))]
        a = max(bucket.start, lo)
        n = max(0, min(bucket.stop, lo + layout.shard_numel) - a)
        at = a - lo if n else 0
        label = f"reduce_scatter({self.label} {bucket.index})"
        if target.fresh:  # straight into the shard
            recv = target.receive_into()[at:at + n]
            self._received[bucket.index] = (target, at, n, recv)
            work = bc.reduce_scatter(bucket.buffer, recv, counts, label)
        else:  # to be added: in place, at the start of the bucket's storage (freed once landed)
            recv = None
            self._received[bucket.index] = (target, at, n, None)
            work = bc.reduce_scatter_in_place(bucket.buffer, counts, label)
        if self.then is None:
            return work
        mine = bucket.buffer[:n] if recv is None else recv
        return work.then(lambda: self.then.all_reduce(
            mine, f"allreduce({self.label} {bucket.index}, after its reduce-scatter)"))

    def land(self, bucket):
        target, at, n, recv = self._received.pop(bucket.index)
        mine = bucket.buffer[:n] if recv is None else recv
        if n:
            average(mine, self.size)
        if recv is not None:
            target.delivered()
        elif n:
            target.add(at, mine)

    def finished(self):
        for target in [self._one] if self._one is not None else self.targets.values():
            target.finished()
