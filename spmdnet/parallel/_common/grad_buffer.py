"""The parameter-and-gradient buffer under DataParallel, ZeRO and FSDP:
flat storage per layout group, gradient buckets reduced during backward.

``ParamAndGradBuffer(params, ...)`` (Megatron-LM's name; PyTorch DDP's
reducer with a comm hook is the other model) lays the parameters out in
layout groups, each a ``FlatLayout`` padded to ``parts`` equal shards:
by default one group per dtype in registration order; ``groups`` names
them instead (FSDP: one per flat shard, with the flat's own layout;
``fully_shard``: a ``ChunkLayout``, without views: gradients copied in). With
``flat_params`` the parameters' arrays become views of one flat array per
group (``param_flats``; ZeRO updates and all-gathers them in place, and a
fused optimizer can step on them in one pass), claimed so ``p.data = t`` is
refused while it holds them (``claim=False``: not claimed; whoever rebinds
a parameter's data then takes it out of the flat array). Parameters sharing
storage stay out (copies would untie them), or with ``claim`` are refused.

With a ``reduction`` (``reductions.AllReduce`` for DataParallel,
``reductions.ReduceScatter`` for ZeRO-2 and FSDP) the gradients are
bucketed (``bucket.Bucket``): whole parameters in reverse registration
order (the order backward makes them final), one group per bucket, the
first bucket small (1 MB) and the others up to ``bucket_mb`` (DDP's
defaults); ``bucket_mb=None``: one bucket per group, covering its whole
padded layout. Backward writes each gradient straight into its bucket
(``autograd.grad_placement``, gradient-as-bucket-view).

When a bucket starts (``start="hooks"``, DataParallel and ZeRO): a
post-accumulate hook counts the bucket's parameters, and a full bucket
starts its collective (``distributed.bucket_collectives``), strictly in
bucket order, overlapped with the rest of backward; the end of backward
(``queue_callback``) calls ``finish``. ``start="call"`` (FSDP, whose units
recompute inside their own backward, so only the wrapper knows when a
unit's gradients are final): the wrapper calls ``open(buckets)`` before a
unit's backward (its parameters' gradients go into the buckets),
``start(buckets)`` at its end (or ``collect(buckets)`` under ``no_sync``:
the gradients stay, and later ones add to them) and ``finish()`` when
backward ends; every rank calls them in the same order.

``finish``: buckets not started (parameters that got no gradient contribute
zeros) start, all complete in start order, the reduction averages and
delivers them, ``on_finish()`` runs. ``grads="persistent"`` (DataParallel):
one flat gradient array per group (``grad_flats``) kept between steps; each
``.grad`` is a Tensor over its view, made once (``homes``).
``grads="transient"`` (ZeRO-2, FSDP): a bucket's storage exists from its
first gradient until its collective has landed (``alloc``/``free``: where
it comes from and goes back to, FSDP's buffer pool), ``.grad`` is dropped
once in the storage, and with ``in_flight`` at most that many starts (a
hook's bucket, or one ``start`` call's buckets) travel at once: the start
after them completes the oldest (0: each start completes at once).

``nonfinite`` other than "ignore": each bucket's local gradients are scanned
before its collective (``bad``: the names of the parameters with NaN/Inf);
``agree_nonfinite`` makes every rank act alike.
"""
from ... import distributed as dist
from ..._owned_storage import claim, release
from ...autograd import queue_callback
from ...autograd.grad_placement import grad_home, place_grad
from ...backend import is_cupy_array, xp_of
from ...distributed.bucket_collectives import BucketComm
from .bucket import Bucket
from .flat import assign_buckets, bucket_bytes, dtype_groups, flatten_params, tied_params
from .wrapping import agree_nonfinite, nonfinite_names

PLACED_ELSEWHERE = ("{who}: parameter {name} already has its gradient placed by another "
                    "wrapper (a parameter's gradients can be reduced by one wrapper only)")
STARTS = ("hooks", "call")


class ParamAndGradBuffer:
    """See the module docstring. ``names``: one per parameter (errors and the
    non-finite report; ``claim_names`` in the ``p.data = t`` refusal, default
    ``names``); ``comm``: the communicator of the collectives;
    ``who``: the wrapper's name in messages; ``groups``: ``[(key, params,
    layout)]`` covering ``params`` (default: by dtype); ``enabled()``: whether
    this backward reduces (DataParallel's ``no_sync`` says no); ``on_finish()``:
    called after each backward's reduction; ``alloc(xp, n, dtype)`` /
    ``free(array)``: transient storage (default: new zeros, dropped);
    ``bc``: a ``BucketComm`` shared with other buffers (default: its own)."""

    def __init__(self, params, names, comm, *, who, reduction=None, parts=1, groups=None,
                 flat_params=False, claim_names=None, grads="persistent", bucket_mb=25.0,
                 mode="nonblocking", in_flight=None, nonfinite="ignore", enabled=None,
                 on_finish=None, start="hooks", alloc=None, free=None, claim=True, bc=None):
        if grads not in ("persistent", "transient"):
            raise ValueError(f"grads must be 'persistent' or 'transient', got {grads!r}")
        if start not in STARTS:
            raise ValueError(f"start must be one of {STARTS}, got {start!r}")
        self.params, self.names, self.who = list(params), list(names), who
        self._name_of = {id(p): n for p, n in zip(self.params, self.names)}
        self.groups = groups if groups is not None else dtype_groups(self.params, parts)
        self.layouts = {key: layout for key, _, layout in self.groups}
        if not all(lay.viewable for lay in self.layouts.values()) and (
                start != "call" or grads != "transient" or nonfinite != "ignore"):
            raise ValueError(f"{who}: layouts without views (ChunkLayout) need start='call', "
                             "grads='transient' and nonfinite='ignore' (gradients are copied in)")
        self._slot = {id(p): (key, i) for key, group, _ in self.groups
                      for i, p in enumerate(group)}
        self.param_flats, self.grad_flats = {}, {}
        self._claimed = []
        if flat_params:
            self._flatten_params(claim_names or self.names, claim)
        self.reduction, self.persistent = reduction, grads == "persistent"
        self.buckets, self._hooks = [], []
        self.bad, self.exposed_s, self.wait_s, self.reductions = [], 0.0, 0.0, 0
        if reduction is None:
            return
        for p in self.params:
            if grad_home(p, resolve=False) is not None:
                raise ValueError(PLACED_ELSEWHERE.format(who=who, name=self._name_of[id(p)]))
        self.buckets = self._make_buckets(bucket_mb)
        self.group_buckets = {key: [b for b in self.buckets if b.key == key]
                           for key, _, _ in self.groups}
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._index_in = {id(p): i for b in self.buckets for i, p in enumerate(b.params)}
        self.bc = bc if bc is not None else BucketComm(comm, mode)
        self.size = self.bc.size
        self.check, self.in_flight, self.by_hooks = nonfinite != "ignore", in_flight, \
            start == "hooks"
        self.enabled = enabled or (lambda: True)
        self.on_finish = on_finish
        self._alloc, self._free = alloc, free
        self._next, self._scheduled, self._waves = 0, False, []
        self.started_early = 0     # of the last backward's buckets, started before finish
        if self.persistent:
            self._persistent_homes()
        else:
            self.drop_grads()      # gradients from before wrapping are not kept
            if self.by_hooks:      # with start="call", ``open`` places them
                self.open(self.buckets)
        if self.by_hooks:
            self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                           for p in self.params]

    # -- storage -------------------------------------------------------------------
    def _make_buckets(self, bucket_mb):
        """Buckets in reduction order: per group (groups in reverse order), its
        parameters in reverse order, cut by ``bucket_mb`` (None: one per group)."""
        if bucket_mb is None:
            return [Bucket(i, key, group, layout, range(len(group)), whole=True)
                    for i, (key, group, layout) in enumerate(self.groups)]
        first, cap = bucket_bytes(bucket_mb)
        cut = assign_buckets(list(reversed(self.params)), first, cap)
        buckets = []
        for params in cut:
            key = self._slot[id(params[0])][0]
            buckets.append(Bucket(len(buckets), key, params, self.layouts[key],
                                  [self._slot[id(p)][1] for p in params]))
        return buckets

    def _flatten_params(self, claim_names, claiming):
        shared = tied_params(self.params, claim_names, self.who, refuse=claiming)
        self.param_flats = flatten_params(self.groups, keep_out=shared)
        if claiming:
            for p, name in zip(self.params, claim_names):
                self.claim(p, f"{name} of {self.who}")

    def claim(self, tensor, owner):
        """Claim one more tensor over this buffer's storage (a shard Parameter)."""
        claim(tensor, owner)
        self._claimed.append(tensor)

    def _persistent_homes(self):
        for key, group, layout in self.groups:
            self.grad_flats[key] = xp_of(group[0].array).zeros(layout.padded_numel,
                                                              group[0].array.dtype)
        for bucket in self.buckets:
            bucket.attach(self.grad_flats[bucket.key][bucket.start:bucket.stop])
            for p, home in zip(bucket.params, bucket.homes):
                if p.grad is not None:
                    home.array[...] = p.grad.array
                    p.grad = home
                place_grad(p, home)

    def _new_storage(self, bucket):
        xp, n = xp_of(bucket.params[0].array), bucket.stop - bucket.start
        if self._alloc is None:
            return xp.zeros(n, bucket.dtype)
        buf = self._alloc(xp, n, bucket.dtype)
        buf[...] = 0
        return buf

    def _staging_home(self, p):
        """Where a transient bucket's parameter's gradient goes: its bucket,
        whose storage is made by the first gradient that arrives (None, the
        default placement, while the storage carries earlier gradients:
        ``collect`` adds them)."""
        bucket = self._bucket_of[id(p)]
        self._reopen(bucket)
        if bucket.carried:
            return None
        if bucket.buffer is None:
            bucket.attach(self._new_storage(bucket))
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
            self._next += 1
            self._start_wave([self.buckets[self._next - 1]])
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

    def open(self, buckets):
        """Backward's gradients of the buckets' parameters go into their
        storage from now on (``start="call"``: until ``collect``/``start``)."""
        for bucket in buckets:
            for p in bucket.params:
                place_grad(p, self._staging_home)

    def collect(self, buckets):
        """``start="call"``: the buckets' gradients of this backward are final
        but not reduced yet (``no_sync``): into their storage, kept; the
        parameters' ``.grad`` dropped, their placement ended."""
        for bucket in buckets:
            self._reopen(bucket)
            bucket.collect(lambda b=bucket: self._new_storage(b))
            for p in bucket.params:
                place_grad(p, None)

    def _reopen(self, bucket):
        """A bucket that gets gradients again after its reduction started in
        this backward (an FSDP unit called twice in one forward): that
        reduction lands first, the new gradients start another."""
        if bucket.started:
            self._complete(bucket)
            bucket.reset()

    def start(self, buckets):
        """``start="call"``: the buckets' gradients are final: collect them
        (zeros where none arrived) and start their collectives, as one start
        (``in_flight`` counts starts). Every rank calls it in the same order."""
        buckets = list(buckets)
        self.collect(buckets)
        for bucket in buckets:
            self._fill(bucket)
        self._start_wave(buckets)

    def _start_wave(self, buckets):
        for bucket in buckets:
            if self.check:
                self.bad += nonfinite_names(
                    bucket.views, [self._name_of[id(p)] for p in bucket.params],
                    whole=bucket.buffer)
            bucket.work = self.reduction.start(self.bc, bucket)
            bucket.started = True
        self._waves.append(buckets)
        if self.in_flight is not None and len(self._waves) > self.in_flight:  # bound memory
            for bucket in self._waves[-1 - self.in_flight]:
                self._complete(bucket)

    def _complete(self, bucket):
        """Wait for the bucket's collective and land it: once per start, at
        the same point on every rank."""
        if bucket.work is None:
            return
        waited = bucket.work.wait()
        self.exposed_s += waited
        self.wait_s += waited
        bucket.work = None
        if not bucket.landed:
            self._land(bucket)

    def _land(self, bucket):
        self.reduction.land(bucket)
        bucket.landed = True
        if not self.persistent:  # the staging storage goes back
            buffer = bucket.detach()
            if self._free is not None:
                self._free(buffer)

    def progress(self):
        """Let MPI progress the collectives in flight; transient buckets that
        are done land (in order), so their storage is freed early."""
        started = [b for wave in self._waves for b in wave]
        if self.persistent:
            self.bc.progress([b.work for b in started])
            return
        for bucket in started:
            if bucket.landed:
                continue
            if bucket.work is None or not bucket.work.test():
                return
            self._land(bucket)

    def finish(self):
        """After backward: the buckets not started (in bucket order) start,
        with zeros for parameters without a gradient; all complete in start
        order, then ``on_finish``."""
        self.started_early = sum(b.started for b in self.buckets)
        self.exposed_s = 0.0
        for bucket in self.buckets:
            if not bucket.started:
                if not self.by_hooks:
                    self.collect([bucket])
                self._fill(bucket)
                self._start_wave([bucket])
        for wave in self._waves:
            for bucket in wave:
                self._complete(bucket)
        for bucket in self.buckets:
            bucket.reset()
        self._next, self._scheduled, self._waves = 0, False, []
        self.reductions += 1
        self.reduction.finished()
        if self.on_finish is not None:
            self.on_finish()

    def _fill(self, bucket):
        if not self.persistent:
            if bucket.buffer is None:  # no gradient arrived: zeros
                bucket.attach(self._new_storage(bucket))
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
