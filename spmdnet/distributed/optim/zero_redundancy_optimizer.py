"""``torch.distributed.optim.ZeroRedundancyOptimizer``: ZeRO stages 1 and 2
(PyTorch's is stage 1; stage 2 is DeepSpeed's ZeRO-2).

All parameters become views into one flat buffer, padded to a multiple of
the communicator size P and cut into P equal shards; rank r owns shard r.
``step()`` runs the wrapped optimizer on this rank's shard only (so its
state, e.g. Adam's two moments, takes 1/P of the memory), then one
in-place Allgather of the flat buffer gives every rank every parameter.

How the gradients arrive (``stage`` and ``reduce_gradients``):
- ``stage=1`` over DataParallel (default): gradients are already averaged;
  each rank reads its shard of them. Every rank keeps all gradients (Ψ).
- ``stage=1, reduce_gradients=True``, without DataParallel: at ``step()`` one
  Reduce_scatter of a full flat gradient buffer hands each rank its averaged
  shard: ZeRO-2's communication, but backward still builds every full
  gradient.
- ``stage=2``, without DataParallel: ZeRO-2. Gradients are reduce-scattered
  bucket by bucket *during* backward (non-blocking: the buffer's buckets,
  ``parallel._common.grad_buffer``, with ``reductions.ReduceScatter``) and each
  parameter's full ``.grad`` is dropped in its hook, so between steps a rank
  keeps only its gradient shard (Ψ/P; ``.grad`` is None on every parameter;
  during backward at most ``IN_FLIGHT + 1`` buckets' storage, ``bucket_mb``
  capping one). A second backward before the next ``zero_grad`` adds into
  the shard (gradient accumulation, one reduce-scatter per backward). Clip
  with ``zo.clip_grad_norm_(max_norm)`` (the global norm over the shards).
  Reduce-scatter + allgather move the bytes of one allreduce, as plain data
  parallelism.

``nonfinite`` (DataParallel's option and default, "ignore"): "raise" or
"skip" checks this rank's local gradients for NaN/Inf (stage 2 in the
gradient hooks, before their reduce-scatter; ``reduce_gradients=True``
before the reduce-scatter; stage 1 over DataParallel the averaged ones) and
all ranks agree at ``step()``: NonFiniteError on every rank naming rank,
parameter and step, or the step is skipped on every rank. A skipped step
(this option, or DataParallel's ``nonfinite="skip"``, which leaves no
gradient at all) leaves every parameter and all optimizer state as they
were, as ``torch.optim`` skips parameters without a gradient.
"""
from itertools import accumulate

from ... import distributed as dist
from ..._tensor import Tensor
from ...autograd.grad_placement import has_placement
from ...backend import is_cupy_array, xp_of
from ...nn.parameter import Parameter
from ...nn.utils.clip_grad import clip_grad_norm_
from ...optim import Adam
from ...parallel._common.flat import FlatLayout
from ...parallel._common.grad_buffer import ParamAndGradBuffer
from ...parallel._common.norm import clip_arrays_
from ...parallel._common.reductions import ReduceScatter
from ...parallel._common.wrapping import agree_nonfinite, nonfinite_mode, nonfinite_names
from ..bucket_collectives import all_gather_in_place
from .zero_state import full_state_dict, load_full_state_dict

IN_FLIGHT = 2          # stage 2: buckets whose storage may be alive at once
DATA_PARALLEL_CLASH = ("ZeroRedundancyOptimizer(stage=2) reduce-scatters the gradients "
                       "itself: do not wrap the model in DataParallel (use stage=1 over "
                       "DataParallel, or stage 2 on the bare model)")


class ZeroRedundancyOptimizer:
    """``ZeroRedundancyOptimizer(params, optimizer_class, process_group=None,
    parameters_as_bucket_view=False, overlap_with_ddp=False, **defaults)``:
    shard ``optimizer_class``'s state over the group (ZeRO-1), and with
    ``stage=2`` the gradients too (ZeRO-2; ``bucket_mb`` caps a bucket of the
    reduce-scatter during backward; ``close()`` removes its hooks).

    PyTorch's arguments, positional as in PyTorch (``optimizer_class``, which
    PyTorch requires, defaults to Adam here): ``process_group`` (a
    ``dist.new_group`` group or a communicator; None: the world);
    ``parameters_as_bucket_view`` is accepted (the parameters are always views
    of one flat buffer); ``overlap_with_ddp=True`` raises NotImplementedError
    (``stage=2`` is spmdnet's overlapped form). spmdnet's, keyword-only:
    ``comm`` (an mpi4py communicator, instead of ``process_group``), ``stage``,
    ``reduce_gradients``, ``bucket_mb``, ``nonfinite`` (the module docstring).

    ``params``: parameters, or parameter groups (dicts with ``"params"`` and
    options, e.g. no weight decay on biases). The flat buffer holds the groups
    one after another; the wrapped optimizer gets one group per group, whose
    one parameter is the group's part of this rank's shard (``shard_params``;
    possibly empty)."""

    def __init__(self, params, optimizer_class=Adam, process_group=None,
                 parameters_as_bucket_view=False, overlap_with_ddp=False, *, comm=None,
                 reduce_gradients=False, stage=1, bucket_mb=25.0, nonfinite="ignore",
                 **defaults):
        if overlap_with_ddp:
            raise NotImplementedError("ZeroRedundancyOptimizer(overlap_with_ddp=True) is not "
                                      "supported by spmdnet (stage=2 reduce-scatters the "
                                      "gradients during backward, on the bare model)")
        if process_group is not None and comm is not None:
            raise ValueError("ZeroRedundancyOptimizer: pass comm or process_group, not both")
        if process_group is not None:
            comm = dist.comm_of(process_group, "ZeroRedundancyOptimizer")
        self.process_group = process_group
        self.parameters_as_bucket_view = parameters_as_bucket_view
        if stage not in (1, 2):
            raise ValueError(f"ZeroRedundancyOptimizer stage must be 1 or 2, got {stage!r} "
                             "(stage 3 is parallel.FullyShardedDataParallel)")
        self.nonfinite, self.steps, self.skipped_steps = nonfinite_mode(nonfinite), 0, 0
        self.groups = _param_groups(params)
        self.params = [p for g in self.groups for p in g["params"]]
        self.names = [f"#{i} (shape {tuple(p.shape)})" for i, p in enumerate(self.params)]
        if not self.params:
            raise ValueError("ZeroRedundancyOptimizer got no parameters that require grad")
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError("ZeroRedundancyOptimizer: a parameter appears more than once "
                             "(twice in one group, or in two groups), as torch.optim refuses")
        dtypes = {str(p.array.dtype) for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"ZeroRedundancyOptimizer needs one dtype, got {sorted(dtypes)}")
        self.comm = dist.comm_or_default(comm)
        self.size, self.rank = self.comm.Get_size(), self.comm.Get_rank()
        self.stage, self.reduce_gradients = stage, reduce_gradients or stage == 2
        if stage == 2 and any(has_placement(p) for p in self.params):
            raise ValueError(DATA_PARALLEL_CLASH)
        self._build_flat(bucket_mb)
        self.optim = optimizer_class([dict(g, params=[p]) for g, p in
                                      zip(self.groups, self.shard_params)], **defaults)
        self.defaults = self.optim.defaults
        self.param_groups = self.optim.param_groups

    def _build_flat(self, bucket_mb):
        """One padded flat buffer (the ``ParamAndGradBuffer``'s); every
        parameter's data becomes a view of it. Stage 2: its buckets
        reduce-scatter into ``grad_shard`` during backward."""
        first = self.params[0].array
        xp = xp_of(first)
        self.layout = FlatLayout([p.array.shape for p in self.params], parts=self.size)
        self.lo, self.hi = self.layout.shard_range(self.rank)
        self.grad_shard = xp.zeros(self.layout.shard_numel, dtype=first.dtype)
        self._reduction = (ReduceScatter(self.grad_shard, self.lo, self.size)
                           if self.stage == 2 else None)
        self._grads_comm = dist.dup(self.comm) if self.stage == 2 else None  # private
        self.buffer = ParamAndGradBuffer(
            self.params, self.names, self._grads_comm or self.comm,
            who="ZeroRedundancyOptimizer", parts=self.size, flat_params=True,
            claim_names=[f"parameter {i} (shape {tuple(p.shape)})"
                         for i, p in enumerate(self.params)],
            reduction=self._reduction, grads="transient", bucket_mb=bucket_mb,
            mode="none" if is_cupy_array(first) else "nonblocking", in_flight=IN_FLIGHT,
            nonfinite=self.nonfinite)
        self.flat = self.buffer.param_flats[first.dtype]
        # per group: its part of this rank's shard (the last group takes the padding)
        ends = [0] + list(accumulate(sum(p.array.size for p in g["params"])
                                     for g in self.groups))
        ends[-1] = self.flat.size
        self.segments = [(min(max(a, self.lo), self.hi), min(max(b, self.lo), self.hi))
                         for a, b in zip(ends[:-1], ends[1:])]
        self.shard_params = [Parameter(self.flat[a:b]) for a, b in self.segments]
        for i, shard in enumerate(self.shard_params):
            self.buffer.claim(shard, f"the shard of parameter group {i} of "
                              "ZeroRedundancyOptimizer")
        self._shard_grads = [Tensor(self.grad_shard if (a, b) == (self.lo, self.hi) else
                                    self.grad_shard[a - self.lo:b - self.lo])
                             for a, b in self.segments]  # the shards' .grad, made once

    @property
    def shard_param(self):
        """The shard Parameter of a single parameter group (what the optimizer updates)."""
        if len(self.shard_params) != 1:
            raise AttributeError(f"shard_param: {len(self.shard_params)} parameter groups; "
                                 "use shard_params")
        return self.shard_params[0]

    # -- the step --------------------------------------------------------------------
    def zero_grad(self, set_to_none=True):
        if self._reduction is not None:
            self.grad_shard[...] = 0
            self._reduction.fresh = True
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        bad, any_grad = [], True
        if self._reduction is not None:
            self._join_if_idle()
            self.buffer.reductions = 0  # a new step begins
            bad, self.buffer.bad = self.buffer.bad, []
        else:
            any_grad = any(p.grad is not None for p in self.params)
            bad = self._local_nonfinite()
            if self.reduce_gradients:
                self._reduce_scatter_grads()
            else:
                self._copy_grad_shard()
        self.steps += 1
        if self.nonfinite != "ignore" and agree_nonfinite(bad, self.nonfinite, self.comm,
                                                          self.steps - 1):
            self.skipped_steps += 1  # every rank skips: no update, no allgather
            self.zero_grad()
            return loss
        for param, grad in zip(self.shard_params, self._shard_grads):
            # no gradient at all (DataParallel skipped the step): the wrapped
            # optimizer skips its shard, as torch.optim skips a .grad of None
            param.grad = grad if any_grad or self.reduce_gradients else None
        self.optim.step()
        self._allgather_params()
        return loss

    def _local_nonfinite(self):
        """Names of the parameters whose ``.grad`` on this rank holds NaN/Inf."""
        if self.nonfinite == "ignore":
            return []
        held = [(n, p.grad.array) for n, p in zip(self.names, self.params) if p.grad is not None]
        return nonfinite_names([a for _, a in held], [n for n, _ in held])

    def _join_if_idle(self):
        """Stage 2: a rank whose backward reached no parameter joins the
        reduce-scatter now (with zeros), before any other collective of this
        step (the clipping norm, ``step()``), so the collectives stay matched."""
        if self.buffer.reductions == 0:
            self.buffer.finish()

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Scale the gradients so their global norm (any p > 0 or inf) is at
        most ``max_norm``; returns the norm before clipping, the same on every rank.
        Stage 2: over the gradient shards (collective: every rank calls it,
        after backward and before ``step()``). Stage 1 over DataParallel: the
        replicated gradients, as ``nn.utils.clip_grad_norm_``."""
        if self._reduction is None:
            if self.reduce_gradients:
                raise ValueError("clip_grad_norm_ with reduce_gradients=True: the gradients "
                                 "are reduced only inside step(); use stage=2")
            return clip_grad_norm_(self.params, max_norm, norm_type)
        self._join_if_idle()  # a rank whose backward reached no parameter
        return clip_arrays_([self.grad_shard], max_norm, norm_type, self.comm)

    def grad_bytes(self):
        """Bytes of gradient arrays this rank holds: stage 2, its shard (plus
        staging buffers in flight); stage 1, also the parameters' full gradients."""
        held = sum(p.grad.array.nbytes for p in self.params if p.grad is not None)
        return self.grad_shard.nbytes + held + self.buffer.staged_bytes()

    def close(self):
        """Stage 2: remove the gradient hooks and free the private communicator.
        The parameters stay views of the flat buffer but are the user's again
        (``p.data = t`` is allowed: this optimizer is done with them)."""
        self.buffer.close()
        if self._grads_comm is not None:
            dist.free(self._grads_comm)
            self._grads_comm = None

    def _copy_grad_shard(self):
        """This rank's shard of the (already averaged) full gradients."""
        self.grad_shard[...] = 0
        for i, start, stop in self.layout.overlaps(self.lo, self.hi):
            p = self.params[i]
            if p.grad is not None:
                at = self.layout.offsets[i] + start - self.lo
                self.grad_shard[at:at + stop - start] = p.grad.array.reshape(-1)[start:stop]

    def _reduce_scatter_grads(self):
        full = self.layout.pack(xp_of(self.flat).zeros_like(self.flat),
                                [None if p.grad is None else p.grad.array for p in self.params])
        self.grad_shard[...] = dist.reduce_scatter_block(full, op="mean", comm=self.comm)

    def _allgather_params(self):
        all_gather_in_place(self.flat, self.comm, "allgather(zero parameters)")

    # -- state ---------------------------------------------------------------------
    def state_bytes(self):
        """Bytes of optimizer state this rank holds (the saving is ~1/P)."""
        return sum(v.nbytes for p in self.shard_params
                   for k, v in self.optim.state.get(p, {}).items()
                   if hasattr(v, "nbytes") and not k.startswith("_"))

    def state_dict(self):
        """The full, unsharded optimizer state (collective: every rank calls it),
        laid out like the wrapped optimizer's own state_dict over the parameter groups."""
        return full_state_dict(self)

    def load_state_dict(self, state_dict):
        """Load a full (unsharded) state: each rank keeps its shard."""
        load_full_state_dict(self, state_dict)


def _param_groups(params):
    """[{"params": [trainable parameters], **options}, ...] from parameters or groups."""
    params = list(params)
    groups = [dict(g) for g in params] if params and isinstance(params[0], dict) else [
        {"params": params}]
    for g in groups:
        g["params"] = [p for p in g["params"] if p.requires_grad]
    return groups
