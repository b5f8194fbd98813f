"""DataParallel: every rank holds the whole model, gradients are averaged.

At construction the ranks check that they built the same model and take
rank 0's parameters. During backward, each bucket of gradients starts its
allreduce as soon as all its gradients are final; when ``loss.backward()``
returns, every ``.grad`` holds the mean over the communicator, identical on
all ranks. Each ``.grad`` is one Tensor per parameter, made once, whose
``.array`` is a view into its bucket (``buckets.Bucket.homes``). See
``buckets`` (memory layout), ``reducer`` (overlap) and ``join`` (ranks with
different numbers of batches: ``with ddp.join():``).
"""
import time

from ... import distributed as dist
from ...backend import is_cupy_array
from ...nn.module import Module
from ...autograd import is_grad_enabled, queue_callback
from .._common.flat import bucket_bytes
from .._common.wrapping import (BackwardSentinel, NoSync, agree_nonfinite, nonfinite_mode,
                                nonfinite_names, wrapping)
from ..sync_batchnorm import attach as attach_sync_batchnorm
from .buckets import build_buckets
from .join import Join, notify
from .reducer import REDUCERS, choose_overlap


class DataParallel(NoSync, Module):
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
        attach_sync_batchnorm(model, base, before_shadow=self._shadow_buffers)
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
        if self._joining and self.require_backward_grad_sync and is_grad_enabled():
            self._join_iterations += 1
            notify(self.comm, True)  # the ranks that ran out of data answer 0
        if self.broadcast_buffers and self.require_backward_grad_sync and is_grad_enabled():
            self._sync_buffers()
        out = self.module(*args, **kwargs)
        if self.require_backward_grad_sync and getattr(out, "requires_grad", False):
            out = BackwardSentinel.apply(out, on_backward=self._schedule_finish)
        return out

    def join(self, joinables=()):
        """``with ddp.join(): for x, y in my_batches: ...``: ranks may have
        different numbers of batches; a rank that runs out shadows the others'
        collectives until every rank has, then all take the parameters of the
        last one (PyTorch's ``join``; the mean stays over the initial number
        of ranks). ``joinables``: more objects to shadow (see ``data_parallel.join``)."""
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
            dist.broadcast(buf.array, root=root, comm=self.comm)

    def _shadow_buffers(self):
        """A joined rank answers the forward's buffer broadcast, once per
        iteration (a SyncBatchNorm's shadow calls it first, see sync_batchnorm)."""
        if self.broadcast_buffers and not self._buffers_answered:
            self._sync_buffers(training=False)
        self._buffers_answered = True

    def join_shadow(self):
        """One iteration's collectives, with zero gradients (see ``data_parallel.join``)."""
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
        if self.require_backward_grad_sync and not self._finish_scheduled:
            self._finish_scheduled = True
            queue_callback(self._finish)

    def _on_grad_ready(self, p):
        if not self.require_backward_grad_sync:
            return
        self._schedule_finish()
        bucket = self._bucket_of[id(p)]
        home, view = p.grad_buffer, self._view_of[id(p)]
        if p.grad is not home or home.array is not view:
            self._bring_home(p, home, view)
        bucket.ready += 1
        self._launch_ready()
        self.reducer.poke()

    @staticmethod
    def _bring_home(p, home, view):
        """The user replaced ``.grad`` (or rebound its ``.data``): copy it into the bucket."""
        if home.array is not view:
            view[...] = home.array
            home.array = view
        if p.grad is not home:
            view[...] = p.grad.array
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
            self._bad += nonfinite_names(bucket.buffer, bucket.views,
                                         [self._names[id(p)] for p in bucket.params])
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
                    home.array, p.grad = view, home
                elif p.grad is not home or home.array is not view:
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
        if agree_nonfinite(bad, self.nonfinite, self.comm, self.steps - 1):
            self._drop_grads()
            self.skipped_steps += 1

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


class DistributedDataParallel(DataParallel):
    """PyTorch's ``DistributedDataParallel`` arguments on ``DataParallel``
    (one implementation; ``spmdnet.nn.parallel`` exports it).

    ``process_group``: a ``dist.new_group`` group (or an mpi4py communicator;
    None: the world). ``bucket_cap_mb`` (None: 25) caps a bucket.
    ``device_ids``/``output_device``: the rank's device is the one
    ``dist.init`` bound (``local_rank % GPUs``), so at most one id is
    accepted and not used. ``find_unused_parameters``, ``static_graph`` and
    ``gradient_as_bucket_view`` are accepted: a parameter without a gradient
    always contributes zeros, and ``.grad`` is always a view into its
    bucket. ``dim``, ``init_sync``, ``check_reduction`` are accepted;
    ``mixed_precision``/``device_mesh`` raise NotImplementedError."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, init_sync=True, process_group=None,
                 bucket_cap_mb=None, find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None,
                 mixed_precision=None, device_mesh=None, **kwargs):
        if device_ids is not None and len(list(device_ids)) > 1:
            raise ValueError(f"DistributedDataParallel: device_ids {list(device_ids)} must be "
                             "None or hold one device (one device per process)")
        for name, value in (("mixed_precision", mixed_precision), ("device_mesh", device_mesh),
                            ("delay_all_reduce_named_params", delay_all_reduce_named_params),
                            ("param_to_hook_all_reduce", param_to_hook_all_reduce)):
            if value is not None:
                raise NotImplementedError(f"DistributedDataParallel({name}=...) is not "
                                          "supported by spmdnet")
        if kwargs:
            raise TypeError(f"DistributedDataParallel got unexpected arguments {sorted(kwargs)}")
        comm = dist.comm_of(process_group, "DistributedDataParallel")
        super().__init__(module, comm=comm,
                         bucket_mb=25.0 if bucket_cap_mb is None else bucket_cap_mb,
                         broadcast_buffers=True if broadcast_buffers is None
                         else broadcast_buffers)
        self.device_ids, self.output_device, self.dim = device_ids, output_device, dim
        self.process_group = process_group
        self.find_unused_parameters, self.static_graph = find_unused_parameters, static_graph
        self.gradient_as_bucket_view = gradient_as_bucket_view
