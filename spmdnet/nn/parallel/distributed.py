"""``torch.nn.parallel.distributed``: ``DistributedDataParallel`` (also
``spmdnet.parallel.DataParallel``, the same class; ``spmdnet.nn.parallel``
names it too): every rank holds the whole model, gradients are averaged.

At construction the ranks check that they built the same model and take
rank 0's parameters. The gradients live in a ``ParamAndGradBuffer``
(``spmdnet.parallel._common.grad_buffer``) configured to all-reduce: during
backward each bucket of gradients starts its allreduce as soon as all its
gradients are final; when ``loss.backward()`` returns, every ``.grad`` holds
the mean over the communicator, identical on all ranks. Each ``.grad`` is one
Tensor per parameter, made once, whose ``.array`` is a view into its bucket
(gradient-as-bucket-view). ``Join`` (``with ddp.join():``) handles ranks with
different numbers of batches; ``allreduce_gradients`` (also
``spmdnet.parallel.allreduce_gradients``) is the explicit, hook-free way to
average gradients.
"""
from ... import distributed as dist
from ...autograd import is_grad_enabled
from ...backend import is_cupy_array, xp_of
from ...distributed.bucket_collectives import choose_mode
from ...parallel._common.flat import FlatLayout
from ...parallel._common.grad_buffer import ParamAndGradBuffer, broadcast_params
from ...parallel._common.reductions import AllReduce
from ...parallel._common.wrapping import (BackwardSentinel, NoSync, agree_nonfinite,
                                          nonfinite_mode, nonfinite_names, wrapping)
from ...parallel.sync_batchnorm import attach as attach_sync_batchnorm
from ..modules.module import Module

__all__ = ["DistributedDataParallel"]  # PyTorch's


class DistributedDataParallel(NoSync, Module):
    """Data parallelism over ``comm`` (default: the world), DDP's semantics.

    ``ddp(x)`` calls ``model(x)``; ``ddp.module`` is the model. PyTorch's
    arguments, positional as in PyTorch, and spmdnet's, keyword-only:
    ``comm`` (an mpi4py communicator) or ``process_group`` (a
    ``dist.new_group`` group); None: the world. ``bucket_mb`` or PyTorch's
    ``bucket_cap_mb`` caps a gradient bucket (default 25; the first one is
    1 MB). ``overlap`` is "auto" (non-blocking Allreduce on
    host buffers, a communication thread for GPU buffers), "nonblocking",
    "thread" or "none" (``distributed.bucket_collectives``).
    ``last_exposed_comm_s`` is the time the last backward waited for
    communication after its computation had finished.

    ``flat_params`` (default True): each dtype's parameters become views of
    one flat array, so with the gradients' flat array (always) an optimizer
    steps them in one call (``optim._flat_runs``); ``p.data = t`` still
    rebinds a parameter (it then steps alone), and parameters sharing storage
    (``b.weight.data = a.weight.data``) keep it: they stay out of the flat array.

    ``nonfinite``: "ignore" (default, no check), "raise" (NonFiniteError on
    every rank naming the rank, parameter and step) or "skip" (every rank
    sets all gradients to None, so the optimizer skips the step). Local
    gradients are checked before their allreduce and the decision is
    reduced, so all ranks act alike.

    ``broadcast_buffers`` (DDP's default True): before each training forward
    (grad enabled, outside ``no_sync``) every rank takes rank 0's buffers
    (BatchNorm's running statistics). A SyncBatchNorm's group must be
    contained in ``comm`` (DistributedError at wrap time otherwise).

    ``device_ids``/``output_device``: the rank's device is the one
    ``dist.init`` bound (``local_rank % GPUs``), so at most one id is
    accepted and not used. ``find_unused_parameters``, ``static_graph`` and
    ``gradient_as_bucket_view`` are accepted: a parameter without a gradient
    always contributes zeros, and ``.grad`` is always a view into its
    bucket. ``dim``, ``init_sync``, ``check_reduction`` are accepted;
    ``mixed_precision``/``device_mesh`` raise NotImplementedError.
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, init_sync=True, process_group=None,
                 bucket_cap_mb=None, find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None,
                 mixed_precision=None, device_mesh=None, *, comm=None, bucket_mb=None,
                 overlap="auto", nonfinite="ignore", flat_params=True):
        _check_torch_arguments(device_ids, mixed_precision, device_mesh,
                               delay_all_reduce_named_params, param_to_hook_all_reduce)
        if process_group is not None and comm is not None:
            raise ValueError("DistributedDataParallel: pass comm or process_group, not both")
        if bucket_cap_mb is not None and bucket_mb is not None:
            raise ValueError("DistributedDataParallel: pass bucket_mb or bucket_cap_mb, not both")
        if process_group is not None:
            comm = dist.comm_of(process_group, "DistributedDataParallel")
        bucket_mb = next((b for b in (bucket_mb, bucket_cap_mb) if b is not None), 25.0)
        broadcast_buffers = True if broadcast_buffers is None else broadcast_buffers
        super().__init__()
        self.device_ids, self.output_device, self.dim = device_ids, output_device, dim
        self.process_group = process_group
        self.find_unused_parameters, self.static_graph = find_unused_parameters, static_graph
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.nonfinite, self.steps, self.skipped_steps = nonfinite_mode(nonfinite), 0, 0
        self.module = module
        world, base, named = wrapping(module, comm)
        self.broadcast_buffers, self._buffers_answered = broadcast_buffers, False
        attach_sync_batchnorm(module, base, before_shadow=self._shadow_buffers)
        # A private communicator: our reductions never interleave with the
        # user's collectives on the same communicator.
        self.comm = dist.dup(base)
        self.size = self.comm.Get_size()
        on_gpu = any(is_cupy_array(p.array) for _, p in named)
        self.overlap = choose_mode(overlap, on_gpu, world.thread_multiple)
        self.buffer = ParamAndGradBuffer(
            [p for _, p in named], [n for n, _ in named], self.comm, who="DataParallel",
            reduction=AllReduce(self.size), bucket_mb=bucket_mb, mode=self.overlap,
            nonfinite=self.nonfinite, enabled=lambda: self.require_backward_grad_sync,
            # PyTorch's DDP owns no parameter storage: ``p.data = t`` stays
            # allowed (claim=False) and moves that parameter out of the flat array
            on_finish=self._after_reduction, flat_params=flat_params, claim=False)
        self._broadcast_state()
        self._joining, self._join_iterations = False, 0
        self.last_exposed_comm_s = 0.0

    @property
    def buckets(self):
        """The gradient buckets (``grad_buffer.Bucket``), in reduction order."""
        return self.buffer.buckets

    # -- construction --------------------------------------------------------------
    def _broadcast_state(self, root=0):
        """Every rank takes ``root``'s parameters and buffers (one Bcast per bucket)."""
        broadcast_params(self.buffer, self.comm, root)
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
        of ranks). ``joinables``: more objects to shadow (see ``Join``)."""
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
            dist.bcast(buf.array, root=root, comm=self.comm)

    def _shadow_buffers(self):
        """A joined rank answers the forward's buffer broadcast, once per
        iteration (a SyncBatchNorm's shadow calls it first, see sync_batchnorm)."""
        if self.broadcast_buffers and not self._buffers_answered:
            self._sync_buffers(training=False)
        self._buffers_answered = True

    def join_shadow(self):
        """One iteration's collectives, with zero gradients (see ``Join``)."""
        self._shadow_buffers()
        self._buffers_answered = False
        self.buffer.drop_grads()
        self.buffer.finish()

    def join_done(self, last_rank):
        """Take the parameters and buffers of ``last_rank``; gradients are kept."""
        kept = [(b, b.buffer.copy(), [p.grad for p in b.params]) for b in self.buckets]
        self._broadcast_state(root=last_rank)
        for bucket, buffer, grads in kept:
            bucket.buffer[...] = buffer
            for p, grad in zip(bucket.params, grads):
                p.grad = grad

    # -- backward ------------------------------------------------------------------
    def _schedule_finish(self):
        if self.require_backward_grad_sync:
            self.buffer.schedule_finish()

    def _after_reduction(self):
        self.steps += 1
        self.last_exposed_comm_s = self.buffer.exposed_s
        if self.nonfinite != "ignore" and self.buffer.agree_nonfinite(
                self.nonfinite, self.comm, self.steps - 1):
            self.buffer.drop_grads()
            self.skipped_steps += 1

    def close(self):
        """Remove the hooks, stop the communication thread, free the communicator."""
        self.buffer.close()
        if self.comm is not None:
            dist.free(self.comm)
            self.comm = None


def _check_torch_arguments(device_ids, mixed_precision, device_mesh, delay_all_reduce,
                           param_to_hook):
    if device_ids is not None and len(list(device_ids)) > 1:
        raise ValueError(f"DistributedDataParallel: device_ids {list(device_ids)} must be "
                         "None or hold one device (one device per process)")
    for name, value in (("mixed_precision", mixed_precision), ("device_mesh", device_mesh),
                        ("delay_all_reduce_named_params", delay_all_reduce),
                        ("param_to_hook_all_reduce", param_to_hook)):
        if value is not None:
            raise NotImplementedError(f"DistributedDataParallel({name}=...) is not "
                                      "supported by spmdnet")


def notify(comm, training):
    """Number of ranks of ``comm`` still training (collective)."""
    return dist.allreduce(int(training), op="sum", comm=comm)


class Join:
    """``with ddp.join(joinables=()):``, uneven inputs (PyTorch's ``join()``).

    When ranks have different numbers of batches, the first rank to run out
    would leave the others waiting in their next gradient allreduce. Inside
    ``with ddp.join():`` every training iteration starts (in ``ddp``'s forward)
    with a one-integer allreduce of "still training" flags on DataParallel's
    communicator; a rank that has run out of data leaves the ``with`` block and
    *shadows* the others: per iteration it answers that allreduce with 0 and then
    runs the collectives of every registered joinable, with zeros. The gradient
    mean stays divided by the initial number of ranks (PyTorch's default
    ``divide_by_initial_world_size``): a rank that has joined contributes zeros.
    When no rank trains any more, every rank takes the parameters and buffers of
    the last rank to run out (ties: the highest rank), so all finish equal.

    A joinable is an object with two methods:
    - ``join_shadow()``: the collectives one training iteration makes, run by a
      rank that has run out of data (zeros in, results ignored);
    - ``join_done(last_rank)``: called once on every rank after the loop.
    DataParallel is one (its gradient buckets and the non-finite check). Modules
    inside the wrapped model that have both methods (a SyncBatchNorm, say) are
    registered automatically; their shadows run before DataParallel's, the order
    of a real iteration (forward reductions, then the buckets), and they must
    communicate on a communicator of their own (not DataParallel's private one).
    """

    def __init__(self, ddp, joinables=()):
        self.ddp = ddp
        found = [m for m in ddp.module.modules() if _is_joinable(m)]
        self.joinables = [*found, *joinables, ddp]

    def __enter__(self):
        self.ddp._join_iterations = 0
        self.ddp._joining = True
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is not None:
                return False  # an error: no shadowing (the abort hook ends the job)
            while notify(self.ddp.comm, False):
                for joinable in self.joinables:
                    joinable.join_shadow()
            last = last_rank(self.ddp.comm, self.ddp._join_iterations)
            for joinable in self.joinables:
                joinable.join_done(last)
        finally:
            self.ddp._joining = False
        return False


def last_rank(comm, iterations):
    """The rank with the most iterations (the highest such rank)."""
    size = comm.Get_size()
    return dist.allreduce(iterations * size + comm.Get_rank(), op="max", comm=comm) % size


def _is_joinable(module):
    return callable(getattr(module, "join_shadow", None)) and \
        callable(getattr(module, "join_done", None))


def allreduce_gradients(params, comm=None, nonfinite="ignore"):
    """Average ``p.grad`` over the communicator for every parameter, in place.

    Parameters are taken in the given order (the same on every rank); one
    flat buffer per dtype is reduced with one Allreduce. A parameter with no
    gradient contributes zeros and receives the average.

    ``nonfinite`` (DataParallel's option and default): "raise" or "skip"
    checks the local gradients first and all ranks agree: NonFiniteError on
    every rank naming rank and parameter, or every ``p.grad`` set to None
    (the optimizer skips the step). Returns True when the step was skipped."""
    comm = dist.comm_or_default(comm)
    params = [p for p in params if p.requires_grad]
    if nonfinite_mode(nonfinite) != "ignore":
        held = [(f"#{i} (shape {tuple(p.shape)})", p.grad.array)
                for i, p in enumerate(params) if p.grad is not None]
        bad = nonfinite_names([a for _, a in held], [n for n, _ in held])
        if agree_nonfinite(bad, nonfinite, comm, None):
            for p in params:
                p.grad = None
            return True
    by_dtype = {}
    for p in params:
        by_dtype.setdefault(str(p.array.dtype), []).append(p)
    for dtype in sorted(by_dtype):
        group = by_dtype[dtype]
        layout = FlatLayout([p.array.shape for p in group])
        flat = xp_of(group[0].array).zeros(layout.numel, dtype=group[0].array.dtype)
        layout.pack(flat, [None if p.grad is None else p.grad.array for p in group])
        dist.allreduce(flat, op="mean", comm=comm)
        for p, chunk in zip(group, layout.views(flat)):
            if p.grad is None:
                p.grad = chunk.copy()
            else:
                p.grad.copy_(chunk)
    return False
