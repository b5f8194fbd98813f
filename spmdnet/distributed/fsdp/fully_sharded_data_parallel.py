"""``torch.distributed.fsdp.FullyShardedDataParallel``: ZeRO-3, parameters,
gradients and optimizer state 1/N per rank.

``FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({Block}))``
(or spmdnet's ``wrap={Block}``): every ``Block`` instance
is its own shard unit, the rest of the model the root unit. A unit's
parameters live as one flat shard per rank (one per dtype and parameter
group, below; padded to a
multiple of the group size N, ceil(numel / N) elements each; ``_flat_param``);
``fsdp.parameters()`` yields these shards, so any optimizer updates only its
1/N, and its state is 1/N too.

Full parameters exist only while their unit runs. A wrapped unit is one
autograd ``Function`` (``_units.UnitRun``): all-gather, forward without a
graph, free; in backward all-gather again, recompute the unit's forward with
a graph, backpropagate, start the reduce-scatter of its gradients, free.

The gradients are the one ``ParamAndGradBuffer`` of DataParallel and ZeRO
(``_common.grad_buffer``), configured as: one layout group and one bucket
per flat (its padded layout), transient storage from the pool, started by
the wrapper (``start="call"``) at each unit's backward end, a
``reductions.ReduceScatter`` into each shard's ``.grad`` (the mean over the
group, as DataParallel), one unit's buckets in flight while the previous
unit recomputes (polled from the parameters' gradient hooks), all complete
when backward returns. Under ``no_sync`` a unit's gradients stay in its
buckets and the next backward adds to them. Gathered parameters and
gradient buckets are pooled buffers, reused from unit to unit and step to
step (``_flat_param.Pool``). Only a unit's inputs are kept between forward and
backward (activation checkpointing per unit: about one more forward of
compute); ``state_dict`` works there too. The root unit, and every unit
with ``reshard_after_forward=False``, is gathered for the whole forward and
backward and reduced when backward ends. Parameters that get no gradient
contribute zeros, also where a unit's output reaches the loss on some ranks
only (every unit's backward runs on every rank, see ``_units``). All ranks
must run the same units in the same order (as PyTorch's FSDP). A parameter
shared by two units is an error; one shared inside a unit is fine.

Parameter groups (minGPT's "no weight decay on biases and LayerNorm"): a
shard is updated as one tensor, so ``param_groups=fn`` at construction
splits each unit's parameters into one flat per distinct options dict
``fn(name, p)`` (and dtype), each padded and sharded on its own
(``_flat_param``); ``fsdp.param_groups()`` then returns the optimizer's
groups.

PyTorch's arguments (``_init_utils``): ``sharding_strategy`` FULL_SHARD
(default) reshards after forward, SHARD_GRAD_OP keeps the full parameters
until backward, NO_SHARD returns a ``DistributedDataParallel`` (whose state
has the model's keys); ``auto_wrap_policy`` (``wrap.py``) picks the units;
``backward_prefetch``/``forward_prefetch`` the prefetched gathers
(``_prefetch``); ``state_dict_type`` the full state on every rank or rank 0
(``_state_dict_utils``). Rank 0's parameters and buffers are always
broadcast (``sync_module_states=True``'s behaviour, whatever its value).
``cpu_offload`` keeps the shards and their gradients on the host;
``mixed_precision`` gathers the shards cast to ``param_dtype`` and
reduce-scatters in ``reduce_dtype`` buckets (``_flat_param.ShardGrad``
casts the result into the shard's gradient).
"""
import inspect

import numpy as np

from ... import distributed as dist
from ..._owned_storage import release
from ..._tensor import Tensor
from ...autograd import is_grad_enabled, queue_callback
from ...nn.modules.module import Module
from ...parallel._common.grad_buffer import ParamAndGradBuffer
from ...parallel._common.norm import clip_arrays_
from ...parallel._common.reductions import ParamShardTarget, ReduceScatter
from ...parallel._common.wrapping import NoSync, nonfinite_mode, wrapping
from ...parallel._common.flat import FlatLayout
from ._flat_param import Pool, ShardGrad, optimizer_groups, split_flats
from ._init_utils import (UNBUILT, cast_inputs, check_unbuilt, comm_of, offload_of,
                          precision_of, prefetch_modes, reshard_of, strategy_of, unit_policy)
from ._module_hooks import run_unit, state_hooks, unit_hooks
from ._prefetch import Prefetcher
from ._state_dict_utils import ShardedState, Unsharded
from ._units import ChainEnd, Unit
from .api import BackwardPrefetch, ShardingStrategy
from .wrap import owners


class FullyShardedDataParallel(NoSync, ShardedState, Module):
    """Fully sharded data parallelism over ``process_group`` (default: the world).

    PyTorch's arguments, positional as in PyTorch (the module docstring;
    ``cpu_offload`` and ``mixed_precision`` as PyTorch's, docs/PYTORCH.md;
    NotImplementedError: ``ignored_modules``/``ignored_states``,
    ``param_init_fn``, ``device_mesh``, HYBRID strategies). Accepted as
    spmdnet's behaviour: ``device_id`` (the rank's device is bound by
    ``dist.init``), ``sync_module_states`` (rank 0's state is always
    broadcast), ``limit_all_gathers`` (at most one gather is ever prefetched),
    ``use_orig_params`` (``parameters()`` are the flat shards either way).

    spmdnet's, keyword-only: ``comm`` (an mpi4py communicator, instead of
    ``process_group``). ``wrap``: module classes (or a predicate on modules)
    whose instances are their own shard units (instead of
    ``auto_wrap_policy``). ``reshard_after_forward=False`` keeps every unit's
    full parameters from its forward to the end of backward (no
    recomputation, more memory; SHARD_GRAD_OP). ``prefetch``: True or False
    sets both ``forward_prefetch`` and ``backward_prefetch`` (BACKWARD_PRE or
    None). ``overlap``: reduce-scatter each unit's gradient non-blocking as
    soon as its backward is done, overlapped with the earlier units' backward
    (False: blocking, for comparison). ``buffer``: the ``ParamAndGradBuffer``
    of the gradients (``buffer.wait_s``: seconds waited for them).
    ``nonfinite``: as DataParallel's ("ignore"/None, "raise" or "skip"),
    local gradients checked before their reduce-scatter, the decision agreed
    by all ranks. ``param_groups``: ``fn(name, p)`` returning a dict of
    optimizer options for an original parameter (``p`` shows its ``shape``,
    ``ndim``, ``dim()``, ``dtype``), e.g. ``{"weight_decay": 0.0}`` for
    biases and LayerNorm weights, ``{}`` for the defaults; each unit then
    holds one flat shard per distinct options dict, and
    ``fsdp.param_groups()`` returns ``[{"params": shards, **options}, ...]``
    for the optimizer.
    """

    def __new__(cls, module=None, process_group=None, sharding_strategy=None, *args, **kwargs):
        if strategy_of(sharding_strategy) is not ShardingStrategy.NO_SHARD:
            return super().__new__(cls)
        given = inspect.signature(cls.__init__).bind(
            None, module, process_group, sharding_strategy, *args, **kwargs).arguments
        check_unbuilt(process_group, **{k: given.get(k) for k in UNBUILT})
        for k in ("cpu_offload", "mixed_precision"):
            if given.get(k) is not None:
                raise NotImplementedError(f"FullyShardedDataParallel(sharding_strategy=NO_SHARD,"
                                          f" {k}={given[k]!r}) is not supported by spmdnet")
        extras = [k for k in ("wrap", "reshard_after_forward", "param_groups", "prefetch",
                              "overlap") if given.get(k) is not None and k in kwargs]
        if extras:
            raise ValueError(f"FullyShardedDataParallel(sharding_strategy=NO_SHARD) is data "
                             f"parallelism: {extras} do not apply")
        ddp = object.__new__(Unsharded)
        ddp.__init__(module, comm=comm_of(process_group, given.get("comm")),
                     nonfinite=given.get("nonfinite", "ignore"))
        return ddp

    def __init__(self, module, process_group=None, sharding_strategy=None, cpu_offload=None,
                 auto_wrap_policy=None, backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                 mixed_precision=None, ignored_modules=None, param_init_fn=None,
                 device_id=None, sync_module_states=False, forward_prefetch=False,
                 limit_all_gathers=True, use_orig_params=False, ignored_states=None,
                 device_mesh=None, *, comm=None, wrap=None, reshard_after_forward=None,
                 prefetch=None, nonfinite="ignore", overlap=True, param_groups=None):
        check_unbuilt(process_group, ignored_modules=ignored_modules,
                      param_init_fn=param_init_fn, ignored_states=ignored_states,
                      device_mesh=device_mesh)
        offload, mp = offload_of(cpu_offload), precision_of(mixed_precision)
        strategy = strategy_of(sharding_strategy)
        reshard_after_forward = reshard_of(strategy, reshard_after_forward)
        forward_prefetch, backward_prefetch = prefetch_modes(forward_prefetch,
                                                             backward_prefetch, prefetch)
        comm = comm_of(process_group, comm)
        super().__init__()
        self.sharding_strategy = (ShardingStrategy.FULL_SHARD if reshard_after_forward
                                  else ShardingStrategy.SHARD_GRAD_OP)
        self.device_id, self.use_orig_params = device_id, use_orig_params
        self.sync_module_states, self.limit_all_gathers = sync_module_states, limit_all_gathers
        self.cpu_offload, self.mixed_precision = cpu_offload, mixed_precision
        self.offload, self.precision = offload, mp
        self._group_fn = param_groups
        self.nonfinite, self.steps, self.skipped_steps = nonfinite_mode(nonfinite), 0, 0
        _, base, _ = wrapping(module, comm)
        object.__setattr__(self, "module", module)  # not a submodule: its parameters are not ours
        self.comm = dist.dup(base)
        self.size, self.rank = self.comm.Get_size(), self.comm.Get_rank()
        self.reshard_after_forward = reshard_after_forward
        for p in module.parameters():  # frozen ones too: they stay full on every rank
            dist.bcast(p.array, root=0, comm=self.comm)
        self.buffer_dtypes = {}  # {name: dtype} of the buffers mixed precision cast
        for name, b in module.named_buffers():
            dist.bcast(b.array, root=0, comm=self.comm)
            if mp.buffer_dtype is not None and b.array.dtype.kind == "f" \
                    and b.array.dtype != mp.buffer_dtype:
                self.buffer_dtypes[name] = b.array.dtype
                b.array = b.array.astype(mp.buffer_dtype)
        self.units, self._module_hooks = [], []
        self._finish_scheduled = self._open_forward = False
        self._chaining, self._last_unit_out = False, None  # see _units.ChainEnd
        self.prefetcher = Prefetcher(self.comm, forward_prefetch, backward_prefetch)
        self.pool = Pool()
        units = owners(module, unit_policy(module, auto_wrap_policy, wrap))
        for uname, (mod, params) in units.items():
            flats = split_flats(params, self._group_fn, self.comm, source=self.prefetcher,
                                pool=self.pool, offload=self.offload,
                                param_dtype=mp.param_dtype)
            if uname and not flats:
                continue  # a wrapped module with no parameters of its own runs as it is
            unit = Unit(uname, mod, flats, recompute=bool(uname) and reshard_after_forward)
            self.units.append(unit)
            if unit.recompute:  # its hooks gather, free and record the UnitRun
                self._module_hooks += unit_hooks(self, unit)
        self.buffer = self._gradient_buffer(overlap)
        # MPICH progresses non-blocking collectives only inside MPI calls: every
        # gradient accumulated into a unit parameter polls the requests in flight.
        self._hooks = [p.register_post_accumulate_grad_hook(self._poke_hook)
                       for f in self.flats() for p in f.params]
        # The model's own state_dict would save its freed (zero-size) parameters:
        # on the wrapped model, as on the wrapper, it is the gathered full state.
        self._module_hooks += state_hooks(self, module)
        for i, unit in enumerate(self.units):
            for j, f in enumerate(unit.flats):
                self.register_parameter(f"shard_{i}_{j}", f.shard)

    def _gradient_buffer(self, overlap):
        """The gradients' ``ParamAndGradBuffer``: one group and one bucket per
        flat (the flat is the group's key), reduce-scattered into the shards'
        ``.grad``."""
        flats, mp = self.flats(), self.precision
        groups, targets = [], {}
        for f in flats:
            layout, lo = f.layout, f.layout.shard_range(self.rank)[0]
            reduce = f.dtype if mp.reduce_dtype is None else mp.reduce_dtype
            if reduce != f.dtype or f.offload:  # buckets in reduce_dtype, on the device
                summed = np.dtype(np.float32) if reduce.name == "bfloat16" else reduce
                layout = FlatLayout(f.shapes, parts=self.size)
                layout.dtype = summed
                grad_dtype = reduce if mp.keep_low_precision_grads else f.dtype
                targets[f] = ShardGrad(f, lo, summed, grad_dtype,
                                       round_to=reduce if summed != reduce else None)
            else:
                targets[f] = ParamShardTarget(f.shard, lo)
            groups.append((f, f.params, layout))
        return ParamAndGradBuffer(
            [p for f in flats for p in f.params], [n for f in flats for n in f.names],
            self.comm, who="FullyShardedDataParallel", groups=groups, bucket_mb=None,
            reduction=ReduceScatter(size=self.size, label="FSDP gradient", targets=targets),
            grads="transient", start="call", mode="nonblocking" if overlap else "none",
            in_flight=1 if overlap else 0,  # overlap=False: each unit's completes at once
            nonfinite=self.nonfinite, on_finish=self._after_reduction,
            alloc=self.pool.take, free=self.pool.give)

    def _buckets(self, unit):
        return [b for f in unit.flats for b in self.buffer.group_buckets[f]]

    def record_unit(self, unit, args, kwargs, data, rng):
        """A wrapped unit's training forward is done (``module_hooks``): its
        output ``data`` as the result of a ``UnitRun``, linked to the previous
        unit's output (see ``units.ChainEnd``)."""
        prev = self._last_unit_out
        links = [] if prev is None or any(prev is a for a in args) else [prev]
        out = run_unit(self, unit, args, kwargs, data, rng, links)
        if self._chaining:  # the next unit (or the model's output) links to it
            self._last_unit_out = out
        return out

    # -- forward / backward ----------------------------------------------------------
    def forward(self, *args, **kwargs):
        kept = [u for u in self.units if not u.recompute]
        grad = is_grad_enabled()
        self._open_forward = False
        self.prefetcher.begin("forward")
        for unit in kept:
            unit.gather()
            if grad:
                self.open_grads(unit)
        self._chaining, self._last_unit_out = grad, None
        if self.precision.cast_root_forward_inputs:
            args, kwargs = cast_inputs(self.precision.param_dtype, args, kwargs)
        try:
            out = self.module(*args, **kwargs)
        except BaseException:
            self._close_grads(kept)
            raise
        finally:
            self.prefetcher.end()
            last, self._chaining, self._last_unit_out = self._last_unit_out, False, None
        if grad and getattr(out, "requires_grad", False):
            self._open_forward = True
            links = [] if last is None or last is out else [last]
            return ChainEnd.apply(out, *links, on_backward=self._schedule_finish)
        out = _owned(out, kept)
        self._close_grads(kept)
        return out

    def _close_grads(self, units):
        """The units' gradients (if any) stay in their buckets, unreduced,
        their placements end; their full parameters are freed."""
        self.buffer.collect(b for u in units for b in self._buckets(u))
        self._free(units)

    @staticmethod
    def _free(units):
        for unit in units:
            unit.free()

    def open_grads(self, unit):
        """The unit's backward is about to run: its gradients go into its buckets."""
        self.buffer.open(self._buckets(unit))

    def poke(self):
        """Let MPI progress the gathers and reduce-scatters in flight."""
        self.prefetcher.poke()
        self.buffer.progress()

    def _poke_hook(self, p):
        self.poke()

    def unit_done(self, unit):
        """A wrapped unit's backward is done (``UnitRun``): start its buckets'
        reduce-scatters (the later unit's, which travelled meanwhile,
        complete), or under ``no_sync`` keep its gradients in them."""
        if self.require_backward_grad_sync:
            self.buffer.start(self._buckets(unit))
        else:
            self.buffer.collect(self._buckets(unit))

    def unit_freed(self, unit):
        """A wrapped unit's backward is done and its full parameters freed:
        with BACKWARD_POST the next unit's gather starts now."""
        self.prefetcher.released()

    def _schedule_finish(self):
        if not self._finish_scheduled:
            self._finish_scheduled = True
            self.prefetcher.begin("backward")
            queue_callback(self._finish)

    def _finish(self):
        """After backward: the kept units' buckets, and those of units no
        gradient reached (zeros, or what ``no_sync`` kept), start together;
        the kept units are freed; all complete (``_after_reduction``)."""
        self._finish_scheduled = self._open_forward = False
        self.prefetcher.end()
        rest = [b for b in self.buffer.buckets if not b.started]
        kept = [u for u in self.units if not u.recompute and any(f.live for f in u.flats)]
        if not self.require_backward_grad_sync:  # the gradients stay in the buckets
            self._close_grads(kept)
            return
        self.buffer.start(rest)
        self._free(kept)
        self.buffer.finish()

    def _after_reduction(self):
        """Every shard has its gradient: a non-finite local gradient raises
        NonFiniteError on every rank, or every rank drops its shards'
        gradients (the optimizer skips the step)."""
        self.steps += 1
        if self.nonfinite != "ignore" and self.buffer.agree_nonfinite(
                self.nonfinite, self.comm, self.steps - 1):
            self._drop_grads()
            self.skipped_steps += 1

    def _drop_grads(self):
        for f in self.flats():
            f.shard.grad = None

    def train(self, mode=True):
        super().train(mode)
        self.module.train(mode)
        return self

    # -- parameters and gradients ----------------------------------------------------
    def flats(self):
        return [f for u in self.units for f in u.flats]

    def param_groups(self, fn=None):
        """The optimizer's parameter groups ``[{"params": shards, **options}]``:
        by the ``param_groups`` function given at construction, or by ``fn``
        (``fn(name, p)`` -> a dict of options). A flat shard is updated as one
        tensor: when ``fn`` gives one flat's parameters different options,
        ValueError (never a silent decay): pass it at construction instead."""
        return optimizer_groups(self.flats(), fn)

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Scale the shards' gradients so their global norm (any p > 0 or inf)
        is at most ``max_norm``; returns the norm before clipping, the same on
        all ranks (collective)."""
        grads = [f.shard.grad.array for f in self.flats() if f.shard.grad is not None]
        return clip_arrays_(grads, max_norm, norm_type, self.comm)

    # -- end -----------------------------------------------------------------------
    def close(self):
        """Give the model back its full parameters and its own forward and
        state_dict methods; free the communicator (collective)."""
        self.buffer.close()
        for f in self.flats():
            f.gather(exact=True)
            for p in f.params:
                p.grad = None
                release(p)  # the full array is the parameter's own again
        self.pool.clear()
        for handle in self._hooks + self._module_hooks:
            handle.remove()
        self._hooks, self._module_hooks = [], []
        if self.comm is not None:
            dist.free(self.comm)
            self.comm = None


def _owned(out, units):
    """``out`` (a unit's or the model's output) without views of the units'
    gathered parameters, which go back to the pool when freed."""
    if not isinstance(out, Tensor):
        return out
    data = out.array
    for unit in units:
        data = unit.own(data)
    return out if data is out.array else Tensor(data)
