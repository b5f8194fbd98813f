"""ZeRO stage 2's gradients: reduce-scattered bucket by bucket during backward.

``ZeroRedundancyOptimizer`` lays the parameters out in one flat buffer
(registration order, padded to P equal shards, rank r owning shard r). For
stage 2 the parameters are also grouped into buckets of whole parameters in
reverse order, the order backward makes gradients final; each bucket covers
one contiguous range of the flat buffer. A post-accumulate-grad hook on each
parameter copies its gradient into its bucket's staging buffer (allocated
when the bucket's first gradient arrives; a bucket of one parameter sends its
gradient array as is) and drops ``p.grad`` at once. A complete bucket starts
a non-blocking ``Ireduce_scatter`` with variable counts: every rank receives
the part of the bucket inside its own shard (possibly nothing) straight into
its gradient shard, and the staging buffer is freed as soon as the request is
seen done. At most ``IN_FLIGHT`` buckets are pending: starting bucket k waits
for bucket k - IN_FLIGHT. When backward ends (``queue_callback``) parameters
that got no gradient contribute zeros, the remaining buckets start, all
complete in index order, and each received part is divided by P (the mean,
as DataParallel).

Between steps a rank holds Ψ/P gradient values (its shard); during backward,
the staging buffers of at most ``IN_FLIGHT + 1`` buckets (``bucket_mb`` caps
one; a larger parameter stands alone). A second backward before the
next ``zero_grad`` adds into the shard (gradient accumulation, one
reduce-scatter per backward). Buckets start and complete in the same order
on every rank; hooks poll the requests in flight (MPICH progresses
non-blocking collectives only inside MPI calls). Device (CuPy) buffers are
reduce-scattered blocking, through host memory, at the end of backward.
"""
from ... import distributed as dist
from ...autograd import queue_callback
from ...backend import asnumpy, is_cupy_array, xp_of
from .._common.flat import assign_buckets, bucket_bytes

IN_FLIGHT = 2          # buckets whose staging buffers may be alive at once
DATA_PARALLEL_CLASH = ("ZeroRedundancyOptimizer(stage=2) reduce-scatters the gradients "
                       "itself: do not wrap the model in DataParallel (use stage=1 over "
                       "DataParallel, or stage 2 on the bare model)")


class _Bucket:
    """Parameters ``params`` (reverse order) covering flat[start:stop]."""

    def __init__(self, index, params, offsets, layout):
        self.index, self.params = index, params
        self.start = min(offsets[id(p)] for p in params)
        self.stop = max(offsets[id(p)] + p.array.size for p in params)
        self.counts = [max(0, min(self.stop, hi) - max(self.start, lo))
                       for lo, hi in map(layout.shard_range, range(layout.parts))]
        self.buffer = self.request = self.recv = None
        self.span = (0, 0)  # (offset in this rank's shard, length) received
        self.ready, self.landed, self.waited = 0, False, False


class GradientReduceScatter:
    """Hooks on ``zo.params`` that leave each rank only ``zo.grad_shard``."""

    def __init__(self, zo, bucket_mb):
        first, cap = bucket_bytes(bucket_mb)  # as DataParallel's buckets
        self.zo, self.comm = zo, dist.dup(zo.comm)  # private: never interleaves with the user's
        self.size, self.MPI = zo.size, dist.mpi()
        self.on_gpu = is_cupy_array(zo.flat)
        offsets = {id(p): off for p, off in zip(zo.params, zo.layout.offsets)}
        groups = assign_buckets(list(reversed(zo.params)), first, cap)
        self.buckets = [_Bucket(i, g, offsets, zo.layout)
                        for i, g in enumerate(groups)]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._offset = offsets
        self._next = 0                  # the next bucket to start
        self._scheduled = False
        self.fresh = True               # the shard holds no gradient yet (after zero_grad)
        self.reductions = 0             # backward passes reduced since the last step
        self.started_early = 0          # of the last backward's buckets, started from hooks
        self.check = zo.nonfinite != "ignore"
        self.bad = []                   # parameters with a non-finite local gradient
        self._names = {id(p): name for p, name in zip(zo.params, zo.names)}
        for p in zo.params:
            p.grad = None               # gradients from before wrapping are not kept
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                       for p in zo.params]

    # -- during backward -----------------------------------------------------------
    def _on_grad_ready(self, p):
        if getattr(p, "grad_buffer", None) is not None:
            raise ValueError(DATA_PARALLEL_CLASH)
        if not self._scheduled:
            self._scheduled = True
            queue_callback(self.finish)
        bucket, g = self._bucket_of[id(p)], p.grad.array
        if self.check and not bool(xp_of(g).isfinite(g).all()):
            self.bad.append(self._names[id(p)])  # agreed by all ranks at step()
        if len(bucket.params) == 1 and g.flags.c_contiguous:
            bucket.buffer = g.reshape(-1)  # a bucket of one: its gradient is sent as is
        else:
            self._stage(bucket)
            at = self._offset[id(p)] - bucket.start
            bucket.buffer[at:at + p.array.size] = g.reshape(-1)
        p.grad = None
        bucket.ready += 1
        while self._next < len(self.buckets) and (
                self.buckets[self._next].ready == len(self.buckets[self._next].params)):
            self._start(self.buckets[self._next])
        self._poke()

    def _stage(self, bucket):
        if bucket.buffer is None:
            bucket.buffer = xp_of(self.zo.flat).zeros(bucket.stop - bucket.start,
                                                      self.zo.flat.dtype)

    def _start(self, bucket):
        """Start the bucket's reduce-scatter (device buffers: deferred to ``finish``)."""
        zo, lo = self.zo, self.zo.lo
        a, b = max(bucket.start, zo.lo), min(bucket.stop, zo.hi)
        n = max(0, b - a)
        if self.fresh:  # receive straight into the shard
            bucket.recv = zo.grad_shard[a - lo:a - lo + n] if n else zo.grad_shard[:0]
        else:
            bucket.recv = xp_of(zo.flat).empty(n, zo.flat.dtype)
        bucket.span = (a - lo, n)
        if not self.on_gpu:
            bucket.request = self.comm.Ireduce_scatter(bucket.buffer, bucket.recv,
                                                       bucket.counts, self.MPI.SUM)
        self._next += 1
        if bucket.index >= IN_FLIGHT:  # bound the staging memory: finish an older bucket
            self._complete(self.buckets[bucket.index - IN_FLIGHT])

    def _complete(self, bucket):
        """Wait for (device: run) the bucket's reduce-scatter and land it. Each
        bucket passes here once, at the same point on every rank: when bucket
        ``index + IN_FLIGHT`` starts, or in ``finish``."""
        if bucket.waited:
            return
        bucket.waited = True
        with dist.guarded(f"reduce_scatter(ZeRO-2 gradient bucket {bucket.index})", self.comm):
            if bucket.request is not None:
                bucket.request.Wait()
            elif not bucket.landed and self.on_gpu:
                self._blocking(bucket)
        if not bucket.landed:
            self._land(bucket)

    def _poke(self):
        """Test the requests in flight (progress); land the finished ones in order."""
        for bucket in self.buckets[:self._next]:
            if bucket.landed:
                continue
            if bucket.request is None or not bucket.request.Test():
                return
            self._land(bucket)

    def _land(self, bucket):
        at, n = bucket.span
        if n:
            inv = 1.0 / self.size
            if self.fresh:
                bucket.recv *= inv
            else:
                self.zo.grad_shard[at:at + n] += bucket.recv * inv
        bucket.buffer = bucket.recv = bucket.request = None  # the staging buffer is freed
        bucket.landed = True

    def finish(self):
        """After backward: the rest of the buckets start, all complete in order."""
        self.started_early = self._next  # buckets started during backward (overlapped)
        for bucket in self.buckets[self._next:]:
            self._stage(bucket)  # parameters without a gradient contribute zeros
            self._start(bucket)
        for bucket in self.buckets:
            self._complete(bucket)
        for bucket in self.buckets:
            bucket.ready, bucket.landed, bucket.waited = 0, False, False
        self._next, self._scheduled = 0, False
        self.fresh = False
        self.reductions += 1

    def _blocking(self, bucket):
        send = asnumpy(bucket.buffer)
        dist.on_host(bucket.recv, lambda buf: self.comm.Reduce_scatter(
            send, buf, bucket.counts, self.MPI.SUM))

    def join_if_idle(self):
        """A rank whose backward reached no parameter joins the reduce-scatter
        now (with zeros): before any other collective of this step (the
        clipping norm, ``step()``), so the collectives stay matched."""
        if self.reductions == 0:
            self.finish()

    def reduce_if_idle(self):
        """At ``step()``: ``join_if_idle``, then a new step begins."""
        self.join_if_idle()
        self.reductions = 0

    def grad_bytes(self):
        """Bytes of gradient arrays this rank holds: its shard, any ``.grad``
        left on the parameters and staging buffers in flight."""
        held = sum(p.grad.array.nbytes for p in self.zo.params if p.grad is not None)
        staged = sum(b.buffer.nbytes for b in self.buckets if b.buffer is not None)
        return self.zo.grad_shard.nbytes + held + staged

    def close(self):
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self.comm is not None:
            dist.free(self.comm)
            self.comm = None
