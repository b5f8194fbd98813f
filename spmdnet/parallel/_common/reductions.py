"""What a ``ParamAndGradBuffer`` does with a full gradient bucket: the
collective it starts and how the result lands (the mean over the ranks).

- ``AllReduce`` (DataParallel): every rank gets the bucket's mean, in place.
- ``ReduceScatter`` (ZeRO-2): rank r gets the mean of the part of the bucket
  inside its shard r of the padded layout, into (or added to) its gradient
  shard.
A reduction is the buffer's comm hook: ``start(bc, bucket)`` returns the
started ``bucket_collectives.Work``; ``land(bucket)`` runs once it is done;
``finished()`` after each backward.
"""
from ...backend import xp_of


class AllReduce:
    def __init__(self, size):
        self.size = size

    def start(self, bc, bucket):
        return bc.all_reduce(bucket.buffer, f"allreduce(gradient bucket {bucket.index})")

    def land(self, bucket):
        if bucket.dtype.kind in "fc" and self.size > 1:
            bucket.buffer *= 1.0 / self.size

    def finished(self):
        pass


class ReduceScatter:
    """Into ``shard`` (this rank's gradient shard, covering ``[lo, lo + len)``
    of the padded layout). ``fresh``: the shard holds no gradient yet (after
    ``zero_grad``), so the reduced part is received straight into it; later
    backward passes add into it (gradient accumulation)."""

    def __init__(self, shard, lo, size, label="ZeRO-2 gradient bucket"):
        self.shard, self.lo, self.size, self.label = shard, lo, size, label
        self.fresh = True
        self._received = {}  # bucket index -> (offset in the shard, receive buffer)

    def start(self, bc, bucket):
        layout, lo = bucket.layout, self.lo
        counts = [max(0, min(bucket.stop, hi) - max(bucket.start, a))
                  for a, hi in map(layout.shard_range, range(layout.parts))]
        a = max(bucket.start, lo)
        n = max(0, min(bucket.stop, lo + self.shard.size) - a)
        at = a - lo if n else 0
        recv = self.shard[at:at + n] if self.fresh else xp_of(self.shard).empty(n,
                                                                                 self.shard.dtype)
        self._received[bucket.index] = (at, recv)
        return bc.reduce_scatter(bucket.buffer, recv, counts,
                                 f"reduce_scatter({self.label} {bucket.index})")

    def land(self, bucket):
        at, recv = self._received.pop(bucket.index)
        n = recv.size
        if n:
            inv = 1.0 / self.size
            if self.fresh:
                recv *= inv
            else:
                self.shard[at:at + n] += recv * inv

    def finished(self):
        self.fresh = False
