"""The parameter-and-gradient buffer under DataParallel and ZeRO: flat
storage per dtype, gradient buckets reduced during backward, written once.

``ParamAndGradBuffer(params, ...)`` (Megatron-LM's name; PyTorch DDP's
reducer with a comm hook is the other model) lays the parameters of each
dtype one after the other in registration order (``FlatLayout``, padded to
``parts`` equal shards when sharded). With ``flat_params`` the parameters'
arrays become views of one flat array per dtype (``param_flats``; ZeRO
updates and all-gathers them in place, and a fused optimizer can step on
them in one pass), claimed so ``p.data = t`` is refused while it holds them.

With a ``reduction`` (``reductions.AllReduce`` for DataParallel,
``reductions.ReduceScatter`` for ZeRO-2) the gradients are bucketed: whole
parameters in reverse registration order (the order backward makes them
final), one dtype per bucket, the first bucket small (1 MB) and the others up
to ``bucket_mb`` (DDP's defaults), each bucket a contiguous range of its
dtype's layout. Backward writes each gradient straight into its bucket
(``autograd.grad_placement``, gradient-as-bucket-view); a post-accumulate
hook counts the bucket's parameters, and a full bucket starts its collective
(``distributed.bucket_collectives``), strictly in bucket order, overlapped
with the rest of backward. When backward ends (``queue_callback``) the
parameters that got no gradient contribute zeros, the remaining buckets
start, all complete in order, and the reduction averages and delivers them.

``grads="persistent"`` (DataParallel): one flat gradient array per dtype
(``grad_flats``) kept between steps; each ``.grad`` is a Tensor over its
view, made once (``homes``). ``grads="transient"`` (ZeRO-2): a bucket's
storage exists from its first gradient until its collective has landed,
``.grad`` is dropped once copied, and at most ``in_flight`` buckets travel
at once (starting bucket k completes bucket k - in_flight).

``nonfinite`` other than "ignore": each bucket's local gradients are scanned
before its collective (``bad``: the names of the parameters with NaN/Inf);
``agree_nonfinite`` makes every rank act alike.
"""
from ... import distributed as dist
from ..._owned_storage import claim, release
from ..._tensor import Tensor
from ...autograd import queue_callback
from ...autograd.grad_placement import grad_home, place_grad
from ...backend import is_cupy_array, xp_of
from ...distributed.bucket_collectives import BucketComm
from .flat import FlatLayout, assign_buckets, bucket_bytes
from .wrapping import agree_nonfinite, nonfinite_names

PLACED_ELSEWHERE = ("{who}: parameter {name} already has its gradient placed by another "
                    "wrapper (a parameter's gradients can be reduced by one wrapper only)")


class Bucket:
    """Parameters ``params`` (one dtype) covering ``[start, stop)`` of their
    dtype's layout. ``buffer``: the bucket's gradient storage (None while a
    transient bucket holds nothing); ``views``/``homes``: each parameter's
    part of it, as an array and as the Tensor that becomes its ``.grad``."""

    def __init__(self, index, params, layout, offsets):
        self.index, self.params, self.layout = index, params, layout
        self.dtype = params[0].array.dtype
        self.start = min(offsets[id(p)] for p in params)
        self.stop = max(offsets[id(p)] + p.array.size for p in params)
        self._at = [offsets[id(p)] - self.start for p in params]
        self.buffer = self.views = self.homes = None
        self.work = None            # the collective in flight
        self.ready = 0              # parameters whose gradient is final this backward
        self.landed = self.waited = False

    @property
    def nbytes(self):
        return (self.stop - self.start) * self.dtype.itemsize

    def attach(self, buffer):
        """Make ``buffer`` (its flat range) this bucket's storage."""
        self.buffer = buffer
        self.views = [buffer[a:a + p.array.size].reshape(p.array.shape)
                      for a, p in zip(self._at, self.params)]
        self.homes = [Tensor(v) for v in self.views]

    def reset(self):
        self.ready, self.landed, self.waited, self.work = 0, False, False, None


class ParamAndGradBuffer:
    """See the module docstring. ``names``: one per parameter (errors and the
    non-finite report; ``claim_names`` in the ``p.data = t`` refusal, default
    ``names``); ``comm``: the communicator of the collectives;
    ``who``: the wrapper's name in messages; ``enabled()``: whether this
    backward reduces (DataParallel's ``no_sync`` says no); ``on_finish()``:
    called after each backward's reduction."""

    def __init__(self, params, names, comm, *, who, reduction=None, parts=1,
                 flat_params=False, claim_names=None, grads="persistent", bucket_mb=25.0,
                 mode="nonblocking", in_flight=None, nonfinite="ignore", enabled=None,
                 on_finish=None):
        if grads not in ("persistent", "transient"):
            raise ValueError(f"grads must be 'persistent' or 'transient', got {grads!r}")
        self.params, self.names, self.who = list(params), list(names), who
        self._name_of = {id(p): n for p, n in zip(self.params, self.names)}
        by_dtype = {}
        for p in self.params:
            by_dtype.setdefault(p.array.dtype, []).append(p)
        self.layouts, self.offsets = {}, {}
        for dtype, group in by_dtype.items():
            layout = self.layouts[dtype] = FlatLayout([p.array.shape for p in group], parts)
            self.offsets.update((id(p), off) for p, off in zip(group, layout.offsets))
        self.param_flats, self.grad_flats = {}, {}
        self._claimed = []
        if flat_params:
            self._flatten_params(by_dtype, claim_names or self.names)
        self.reduction, self.persistent = reduction, grads == "persistent"
        self.buckets, self._hooks = [], []
        self.bad, self.exposed_s, self.reductions = [], 0.0, 0
        if reduction is None:
            return
        for p in self.params:
            if grad_home(p, resolve=False) is not None:
                raise ValueError(PLACED_ELSEWHERE.format(who=who, name=self._name_of[id(p)]))
        first, cap = bucket_bytes(bucket_mb)
        groups = assign_buckets(list(reversed(self.params)), first, cap)
        self.buckets = [Bucket(i, g, self.layouts[g[0].array.dtype], self.offsets)
                        for i, g in enumerate(groups)]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._index_in = {id(p): i for b in self.buckets for i, p in enumerate(b.params)}
        self.bc = BucketComm(comm, mode)
        self.size = self.bc.size
        self.check, self.in_flight = nonfinite != "ignore", in_flight
        self.enabled = enabled or (lambda: True)
        self.on_finish = on_finish
        self._next, self._scheduled = 0, False
        self.started_early = 0     # of the last backward's buckets, started from hooks
        if self.persistent:
            self._persistent_homes(by_dtype)
        else:
            for p in self.params:
                p.grad = None      # gradients from before wrapping are not kept
                place_grad(p, self._staging_home)
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                       for p in self.params]

    # -- storage -------------------------------------------------------------------
    def _flatten_params(self, by_dtype, claim_names):
        claim_name = {id(p): n for p, n in zip(self.params, claim_names)}
        for dtype, group in by_dtype.items():
            layout = self.layouts[dtype]
            xp = xp_of(group[0].array)
            flat = layout.pack(xp.zeros(layout.padded_numel, dtype), [p.array for p in group])
            self.param_flats[dtype] = flat
            for p, view in zip(group, layout.views(flat)):
                p.array = view  # from now on updated in place (optimizer, all-gather)
                claim(p, f"{claim_name[id(p)]} of {self.who}")
                self._claimed.append(p)

    def claim(self, tensor, owner):
        """Claim one more tensor over this buffer's storage (a shard Parameter)."""
        claim(tensor, owner)
        self._claimed.append(tensor)

    def _persistent_homes(self, by_dtype):
        for dtype, group in by_dtype.items():
            self.grad_flats[dtype] = xp_of(group[0].array).zeros(
                self.layouts[dtype].padded_numel, dtype)
        for bucket in self.buckets:
            bucket.attach(self.grad_flats[bucket.dtype][bucket.start:bucket.stop])
            for p, home in zip(bucket.params, bucket.homes):
                if p.grad is not None:
                    home.array[...] = p.grad.array
                    p.grad = home
                place_grad(p, home)

    def _staging_home(self, p):
        """Where a transient bucket's parameter's gradient goes: its bucket,
        whose storage is made by the first gradient that arrives."""
        bucket = self._bucket_of[id(p)]
        if bucket.buffer is None:
            bucket.attach(xp_of(p.array).zeros(bucket.stop - bucket.start, bucket.dtype))
        return bucket.homes[self._index_in[id(p)]]

    # -- during backward -----------------------------------------------------------
    def schedule_finish(self):
        """Reduce when the running backward ends (once per backward)."""
        if not self._scheduled:
            self._scheduled = True
            queue_callback(self.finish)

    def _on_grad_ready(self, p):
        if not self.enabled():
            return
        self.schedule_finish()
        bucket = self._bucket_of[id(p)]
        if self.persistent:
            self._bring_home(bucket, self._index_in[id(p)])
        else:
            home = self._staging_home(p)
            if p.grad is not home or home.array is not bucket.views[self._index_in[id(p)]]:
                bucket.views[self._index_in[id(p)]][...] = p.grad.array
            p.grad = None
        bucket.ready += 1
        while self._next < len(self.buckets) and (
                self.buckets[self._next].ready == len(self.buckets[self._next].params)):
            self._start(self.buckets[self._next])
        self.progress()

    def _bring_home(self, bucket, i):
        """The user replaced ``.grad`` (or rebound its ``.data``): copy it into the bucket."""
        p, home, view = bucket.params[i], bucket.homes[i], bucket.views[i]
        if home.array is not view:
            view[...] = home.array
            home.array = view
        if p.grad is not home:
            view[...] = p.grad.array
            p.grad = home

    def _start(self, bucket):
        if self.check:
            self.bad += nonfinite_names(bucket.views, [self._name_of[id(p)] for p in bucket.params],
                                        whole=bucket.buffer)
        bucket.work = self.reduction.start(self.bc, bucket)
        self._next += 1
        if self.in_flight and bucket.index >= self.in_flight:  # bound the staging memory
            self._complete(self.buckets[bucket.index - self.in_flight])

    def _complete(self, bucket):
        """Wait for the bucket's collective and land it: once per bucket per
        backward, at the same point on every rank."""
        if bucket.waited:
            return
        bucket.waited = True
        self.exposed_s += bucket.work.wait()
        bucket.work = None
        if not bucket.landed:
            self._land(bucket)

    def _land(self, bucket):
        self.reduction.land(bucket)
        bucket.landed = True
        if not self.persistent:  # the staging storage is freed
            bucket.buffer = bucket.views = bucket.homes = None

    def progress(self):
        """Let MPI progress the collectives in flight; transient buckets that
        are done land (in order), so their storage is freed early."""
        started = self.buckets[:self._next]
        if self.persistent:
            self.bc.progress([b.work for b in started if not b.waited])
            return
        for bucket in started:
            if bucket.landed:
                continue
            if bucket.work is None or not bucket.work.test():
                return
            self._land(bucket)

    def finish(self):
        """After backward: parameters without a gradient contribute zeros, the
        remaining buckets start, all complete in order, then ``on_finish``."""
        self.started_early = self._next
        self.exposed_s = 0.0
        for bucket in self.buckets[self._next:]:
            self._fill(bucket)
            self._start(bucket)
        for bucket in self.buckets:
            self._complete(bucket)
        for bucket in self.buckets:
            bucket.reset()
        self._next, self._scheduled = 0, False
        self.reductions += 1
        self.reduction.finished()
        if self.on_finish is not None:
            self.on_finish()

    def _fill(self, bucket):
        if not self.persistent:
            if bucket.buffer is None:  # no gradient arrived: zeros
                bucket.attach(xp_of(bucket.params[0].array).zeros(
                    bucket.stop - bucket.start, bucket.dtype))
            return
        for i, (p, view, home) in enumerate(zip(bucket.params, bucket.views, bucket.homes)):
            if p.grad is None:
                view[...] = 0
                home.array, p.grad = view, home
            elif p.grad is not home or home.array is not view:
                self._bring_home(bucket, i)

    def agree_nonfinite(self, mode, comm, step):
        """Every rank's verdict on the non-finite gradients seen since the
        last call (see ``wrapping.agree_nonfinite``)."""
        bad, self.bad = self.bad, []
        return agree_nonfinite(bad, mode, comm, step)

    # -- the rest ------------------------------------------------------------------
    @property
    def on_gpu(self):
        return any(is_cupy_array(p.array) for p in self.params)

    def staged_bytes(self):
        """Bytes of transient bucket storage alive now."""
        if self.persistent:
            return 0
        return sum(b.buffer.nbytes for b in self.buckets if b.buffer is not None)

    def drop_grads(self):
        for p in self.params:
            p.grad = None

    def close(self):
        """Remove the hooks and placements, stop the communication thread,
        release the parameters' storage (they stay views of the flat arrays)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self.reduction is not None:
            for p in self.params:
                place_grad(p, None)
            self.bc.close()
        for t in self._claimed:
            release(t)
        self._claimed = []


def broadcast_params(buffer, comm, root=0):
    """Every rank takes ``root``'s parameters (one broadcast per bucket, the
    persistent gradient storage as the staging buffer; gradients cleared)."""
    for bucket in buffer.buckets:
        for p, view in zip(bucket.params, bucket.views):
            view[...] = p.array
        dist.bcast(bucket.buffer, root=root, comm=comm)
        for p, view in zip(bucket.params, bucket.views):
            p.array[...] = view
        bucket.buffer[...] = 0
        for p, home in zip(bucket.params, bucket.homes):
            if p.grad is home:
                p.grad = None  # gradients from before wrapping are not kept
