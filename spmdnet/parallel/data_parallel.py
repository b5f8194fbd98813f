"""DataParallel: every rank holds the whole model, gradients are averaged.

At construction the ranks check that they built the same model and take
rank 0's parameters. During backward, each bucket of gradients starts its
allreduce as soon as all its gradients are final; when ``loss.backward()``
returns, every ``.grad`` holds the mean over the communicator, identical on
all ranks. Each ``.grad`` is one Tensor per parameter, made once, whose
``.data`` is a view into its bucket (``buckets.Bucket.homes``). See
``buckets`` (memory layout), ``reducer`` (overlap) and ``join`` (ranks with
different numbers of batches: ``with ddp.join():``).
"""
import contextlib
import time

from .. import distributed as dist
from ..backend import is_cupy_array, xp_of
from ..errors import DistributedError, NonFiniteError
from ..nn.module import Module
from ..autograd import Function, is_grad_enabled, queue_callback
from .buckets import bucket_bytes, build_buckets
from .join import Join, notify
from .reducer import REDUCERS, choose_overlap
from .sync_batchnorm import attach as attach_sync_batchnorm


class _BackwardSentinel(Function):
    """Identity on the model's output whose backward makes sure the
    reduction is scheduled even when no parameter receives a gradient."""

    def forward(self, x, owner=None):
        self.owner = owner
        return x

    def backward(self, g):
        self.owner._schedule_finish()
        return g


def check_same_parameters(comm, named):
    """Raise DistributedError on every rank unless all ranks hold parameters
    with the same names, shapes and dtypes (in the same order)."""
    mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in named]
    with dist.guarded("allgather(DataParallel parameters)", comm):
        everyone = comm.allgather(mine)
    for r, theirs in enumerate(everyone):
        if theirs == everyone[0]:
            continue
        for i in range(max(len(theirs), len(everyone[0]))):
            a = everyone[0][i] if i < len(everyone[0]) else None
            b = theirs[i] if i < len(theirs) else None
            if a != b:
                raise DistributedError(
                    f"DataParallel: ranks built different models; parameter #{i}: "
                    f"rank 0 has {_describe(a)}, rank {r} has {_describe(b)}")


def wrapping(model, comm):
    """(World, the base communicator, the model's trainable [(name, param)])
    for a wrapper over ``comm`` (None: the world, initialised); raises unless
    every rank built the same model."""
    world = dist.init() if comm is None else dist.world()
    base = comm if comm is not None else world.comm
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    check_same_parameters(base, named)
    return world, base, named


def _describe(entry):
    if entry is None:
        return "no parameter"
    name, shape, dtype = entry
    return f"{name!r} shape {shape} dtype {dtype}"


def nonfinite_mode(nonfinite):
    """The ``nonfinite=`` option checked ("ignore", "raise" or "skip"; None: "ignore")."""
    if nonfinite not in (None, "ignore", "raise", "skip"):
        raise ValueError(f"nonfinite must be 'ignore', 'raise' or 'skip', got {nonfinite!r}")
    return nonfinite or "ignore"


def nonfinite_params(bucket, names):
    """Names of the bucket's parameters whose local gradient has NaN or Inf."""
    xp = xp_of(bucket.buffer)
    if bool(xp.isfinite(bucket.buffer).all()):
        return []
    return [names[id(p)] for p, v in zip(bucket.params, bucket.views)
            if not bool(xp.isfinite(v).all())]


class DataParallel(Module):
    """Data parallelism over ``comm`` (default: the world), DDP's semantics.

    ``ddp(x)`` calls ``model(x)``; ``ddp.module`` is the model. ``bucket_mb``
    caps a gradient bucket; ``overlap`` is "auto" (non-blocking Allreduce on
    host buffers, a communication thread for GPU buffers), "nonblocking",
    "thread" or "none". ``last_exposed_comm_s`` is the time the last
    backward waited for communication after its computation had finished.

    ``nonfinite``: "ignore" (default, no check), "raise" (NonFiniteError on
    every rank naming the rank, parameter and step) or "skip" (every rank
    sets all gradients to None, so the optimizer skips the step). Local
    gradients are checked before their allreduce and the decision is
    reduced, so all ranks act alike.

    ``broadcast_buffers`` (DDP's default True): before each training forward
    (grad enabled, outside ``no_sync``) every rank takes rank 0's buffers
    (BatchNorm's running statistics). A SyncBatchNorm's group must be
    contained in ``comm`` (DistributedError at wrap time otherwise).
    """

    def __init__(self, model, comm=None, bucket_mb=25.0, overlap="auto", nonfinite="ignore",
                 broadcast_buffers=True):
        super().__init__()
        first, cap = bucket_bytes(bucket_mb)
        self.nonfinite, self.steps, self.skipped_steps = nonfinite_mode(nonfinite), 0, 0
        self.module = model
        world, base, named = wrapping(model, comm)
        self.broadcast_buffers, self._buffers_answered = broadcast_buffers, False
        attach_sync_batchnorm(self, model, base)
        # A private communicator: our reductions never interleave with the
        # user's collectives on the same communicator.
        self.comm = dist.dup(base)
        self.size = self.comm.Get_size()
        params = [p for _, p in reversed(named)]
        self._names = {id(p): n for n, p in named}
        self._bad = []
        self.buckets = build_buckets(params, first, cap) if params else []
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._view_of = {id(p): v for b in self.buckets for p, v in zip(b.params, b.views)}
        self._broadcast_state()
        on_gpu = any(is_cupy_array(b.buffer) for b in self.buckets)
        self.overlap = choose_overlap(overlap, on_gpu, world.thread_multiple)
        if on_gpu and self.overlap == "nonblocking":
            raise ValueError("overlap='nonblocking' is not safe on GPU buffers (Open MPI "
                             "has no non-blocking reductions on device memory)")
        self.reducer = REDUCERS[self.overlap](self.comm)
        self._sync = True
        self._joining, self._join_iterations = False, 0
        self._finish_scheduled = False
        self._next = 0
        self.last_exposed_comm_s = 0.0
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                       for p in params]

    # -- construction --------------------------------------------------------------
    def _broadcast_state(self, root=0):
        """Every rank takes ``root``'s parameters and buffers (one Bcast per bucket)."""
        for bucket in self.buckets:
            bucket.pack_data()
            dist.broadcast(bucket.buffer, root=root, comm=self.comm)
            bucket.unpack_data()
            bucket.buffer[...] = 0
            for p, home in zip(bucket.params, bucket.homes):
                if p.grad is home:
                    p.grad = None  # gradients from before wrapping are not kept
        self._broadcast_buffers(root)

    # -- forward -------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self._joining and self._sync and is_grad_enabled():
            self._join_iterations += 1
            notify(self.comm, True)  # the ranks that ran out of data answer 0
        if self.broadcast_buffers and self._sync and is_grad_enabled():
            self._sync_buffers()
        out = self.module(*args, **kwargs)
        if self._sync and getattr(out, "requires_grad", False):
            out = _BackwardSentinel.apply(out, owner=self)
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally, with no communication, inside the block;
        the first backward after it reduces the accumulated sum."""
        prev, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = prev

    def join(self, joinables=()):
        """``with ddp.join(): for x, y in my_batches: ...``: ranks may have
        different numbers of batches; a rank that runs out shadows the others'
        collectives until every rank has, then all take the parameters of the
        last one (PyTorch's ``join``; the mean stays over the initial number
        of ranks). ``joinables``: more objects to shadow (see ``parallel.join``)."""
        return Join(self, joinables)

    def _sync_buffers(self, training=True):
        """Every rank takes rank 0's buffers (``broadcast_buffers``); under
        ``join``, those of the highest rank still training (PyTorch's
        authoritative rank: a rank that ran out holds stale ones)."""
        root = 0
        if self._joining:
            mine = self.comm.Get_rank() if training else -1
            root = dist.allreduce(mine, op="max", comm=self.comm)
        self._broadcast_buffers(root)

    def _broadcast_buffers(self, root):
        for _, buf in self.module.named_buffers():
            dist.broadcast(buf.data, root=root, comm=self.comm)

    def _shadow_buffers(self):
        """A joined rank answers the forward's buffer broadcast, once per
        iteration (a SyncBatchNorm's shadow calls it first, see sync_batchnorm)."""
        if self.broadcast_buffers and not self._buffers_answered:
            self._sync_buffers(training=False)
        self._buffers_answered = True

    def join_shadow(self):
        """One iteration's collectives, with zero gradients (see ``parallel.join``)."""
        self._shadow_buffers()
        self._buffers_answered = False
        self._drop_grads()
        self._finish()

    def join_done(self, last_rank):
        """Take the parameters and buffers of ``last_rank``; gradients are kept."""
        kept = [(b, b.buffer.copy(), [p.grad for p in b.params]) for b in self.buckets]
        self._broadcast_state(root=last_rank)
        for bucket, buffer, grads in kept:
            bucket.buffer[...] = buffer
            for p, grad in zip(bucket.params, grads):
                p.grad = grad

    # -- during backward -----------------------------------------------------------
    def _schedule_finish(self):
        if self._sync and not self._finish_scheduled:
            self._finish_scheduled = True
            queue_callback(self._finish)

    def _on_grad_ready(self, p):
        if not self._sync:
            return
        self._schedule_finish()
        bucket = self._bucket_of[id(p)]
        home, view = p.grad_buffer, self._view_of[id(p)]
        if p.grad is not home or home.data is not view:
            self._bring_home(p, home, view)
        bucket.ready += 1
        self._launch_ready()
        self.reducer.poke()

    @staticmethod
    def _bring_home(p, home, view):
        """The user replaced ``.grad`` (or its ``.data``): copy it into the bucket."""
        if home.data is not view:
            view[...] = home.data
            home.data = view
        if p.grad is not home:
            view[...] = p.grad.data
            p.grad = home

    def _launch_ready(self):
        """Start full buckets, strictly in index order (the same on all ranks)."""
        while self._next < len(self.buckets):
            bucket = self.buckets[self._next]
            if bucket.ready < len(bucket.params):
                return
            self._start(bucket)

    def _start(self, bucket):
        if self.nonfinite != "ignore":
            self._bad += nonfinite_params(bucket, self._names)
        bucket.launched = True
        self.reducer.start(bucket)
        self._next += 1

    def _finish(self):
        """After backward: parameters without a gradient contribute zeros,
        remaining buckets start in order, all complete in order, then / size."""
        t0 = time.perf_counter()
        for bucket in self.buckets[self._next:]:
            for p, view, home in zip(bucket.params, bucket.views, bucket.homes):
                if p.grad is None:
                    view[...] = 0
                    home.data, p.grad = view, home
                elif p.grad is not home or home.data is not view:
                    self._bring_home(p, home, view)
            self._start(bucket)
        for bucket in self.buckets:
            with dist.guarded(f"allreduce(gradient bucket {bucket.index})", self.comm,
                              bucket.buffer):
                self.reducer.wait(bucket)
            if bucket.dtype.kind in "fc" and self.size > 1:
                bucket.buffer *= 1.0 / self.size
            bucket.reset()
        self._next = 0
        self._finish_scheduled = False
        self.steps += 1
        self.last_exposed_comm_s = time.perf_counter() - t0
        if self.nonfinite != "ignore":
            self._handle_nonfinite()

    def _handle_nonfinite(self):
        """Agree on whether any rank saw a non-finite gradient, then act alike."""
        bad, self._bad = self._bad, []
        if not dist.allreduce(int(bool(bad)), op="max", comm=self.comm):
            return
        with dist.guarded("allgather(non-finite gradients)", self.comm):
            everyone = self.comm.allgather(bad)
        table = [f"rank {r} parameter {name!r}" for r, names in enumerate(everyone)
                 for name in names]
        where = f"non-finite gradient at step {self.steps - 1}: " + ", ".join(table)
        if self.nonfinite == "raise":
            raise NonFiniteError(where)
        self._drop_grads()
        self.skipped_steps += 1
        if self.comm.Get_rank() == 0:
            dist.get_logger().warning("%s; step skipped on every rank", where)

    def _drop_grads(self):
        for bucket in self.buckets:
            for p in bucket.params:
                p.grad = None

    def close(self):
        """Remove the hooks, stop the communication thread, free the communicator."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self.reducer.close()
        for bucket in self.buckets:
            for p in bucket.params:
                p.grad_buffer = None
        if self.comm is not None:
            dist.free(self.comm)
            self.comm = None
