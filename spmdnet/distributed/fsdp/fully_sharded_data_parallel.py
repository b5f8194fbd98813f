"""``FullyShardedDataParallel`` with PyTorch's arguments, on spmdnet's
implementation (``spmdnet.parallel.fsdp``): argument mapping only.

- ``sharding_strategy``: FULL_SHARD (default) frees a wrapped unit's full
  parameters after its forward (``reshard_after_forward=True``),
  SHARD_GRAD_OP keeps them until backward (``False``); NO_SHARD is data
  parallelism (``DistributedDataParallel`` whose ``state_dict`` has the
  model's keys, as FSDP's full state); HYBRID_SHARD and _HYBRID_SHARD_ZERO2
  raise NotImplementedError.
- ``auto_wrap_policy``: PyTorch's policies (``wrap.py``) pick the units.
- ``process_group``: a ``dist.new_group`` group (or a communicator).
- ``state_dict_type(model, FULL_STATE_DICT, FullStateDictConfig(rank0_only=...))``
  is the one state-dict type: the full state with the original keys.
- Accepted, no effect: ``device_id`` (the rank's device is bound by
  ``dist.init``), ``sync_module_states`` (rank 0's parameters are always
  broadcast), ``backward_prefetch``, ``forward_prefetch``,
  ``limit_all_gathers``, ``use_orig_params``. NotImplementedError:
  ``cpu_offload`` with ``offload_params=True``, ``mixed_precision``,
  ``ignored_modules``/``ignored_states``, ``param_init_fn``, ``device_mesh``.
"""
import contextlib
import inspect

from ... import distributed as dist
from ...nn.parallel.distributed import DistributedDataParallel
from ...parallel.fsdp import FullyShardedDataParallel as _Sharded
from .api import FullStateDictConfig, ShardingStrategy, StateDictType
from .wrap import as_wrap

_RESHARD = {ShardingStrategy.FULL_SHARD: True, ShardingStrategy.SHARD_GRAD_OP: False}
_UNSUPPORTED = ("cpu_offload", "mixed_precision", "ignored_modules", "param_init_fn",
                "ignored_states", "device_mesh")


def _refuse(**options):
    for name, value in options.items():
        if value is not None and value is not False:
            raise NotImplementedError(f"FullyShardedDataParallel({name}={value!r}) is not "
                                      "supported by spmdnet")


def _strategy(sharding_strategy):
    strategy = ShardingStrategy.FULL_SHARD if sharding_strategy is None else sharding_strategy
    if not isinstance(strategy, ShardingStrategy):
        raise TypeError(f"sharding_strategy must be a ShardingStrategy, got {strategy!r}")
    if strategy not in _RESHARD and strategy is not ShardingStrategy.NO_SHARD:
        raise NotImplementedError(
            f"sharding_strategy={strategy}: spmdnet shards over one process group; use "
            "FULL_SHARD, SHARD_GRAD_OP or NO_SHARD (or a 2-D layout with dist.Mesh)")
    return strategy


class _StateDictMode:
    """What ``state_dict_type`` chose for the FSDP modules of a model."""
    rank0_only = False

    def _pytorch_state(self, state):
        return {} if self.rank0_only and dist.get_rank() != 0 else state


class _Unsharded(_StateDictMode, DistributedDataParallel):
    """NO_SHARD: data parallelism; the state has the model's own keys."""

    def state_dict(self, *args, **kwargs):
        return self._pytorch_state(self.module.state_dict(*args, **kwargs))

    def load_state_dict(self, state, strict=True):
        return self.module.load_state_dict(state, strict)


class FullyShardedDataParallel(_StateDictMode, _Sharded):
    """PyTorch's ``FullyShardedDataParallel`` (see the module docstring)."""

    def __new__(cls, module=None, process_group=None, sharding_strategy=None, *args, **kwargs):
        if _strategy(sharding_strategy) is ShardingStrategy.NO_SHARD:
            given = inspect.signature(cls.__init__).bind(
                None, module, process_group, sharding_strategy, *args, **kwargs).arguments
            _check(process_group, **{k: given.get(k) for k in _UNSUPPORTED})
            ddp = object.__new__(_Unsharded)
            ddp.__init__(module, process_group=process_group)
            return ddp
        return super().__new__(cls)

    def __init__(self, module, process_group=None, sharding_strategy=None, cpu_offload=None,
                 auto_wrap_policy=None, backward_prefetch=None, mixed_precision=None,
                 ignored_modules=None, param_init_fn=None, device_id=None,
                 sync_module_states=False, forward_prefetch=False, limit_all_gathers=True,
                 use_orig_params=False, ignored_states=None, device_mesh=None):
        _check(process_group, cpu_offload=cpu_offload, mixed_precision=mixed_precision,
               ignored_modules=ignored_modules, param_init_fn=param_init_fn,
               ignored_states=ignored_states, device_mesh=device_mesh)
        super().__init__(module, comm=dist.comm_of(process_group, "FullyShardedDataParallel"),
                         wrap=as_wrap(module, auto_wrap_policy),
                         reshard_after_forward=_RESHARD[_strategy(sharding_strategy)])
        self.sharding_strategy = _strategy(sharding_strategy)

    def state_dict(self, *args, **kwargs):
        return self._pytorch_state(super().state_dict())

    @staticmethod
    @contextlib.contextmanager
    def state_dict_type(module, state_dict_type, state_dict_config=None,
                        optim_state_dict_config=None):
        """``with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
        FullStateDictConfig(rank0_only=True)):`` (the full state is the one type)."""
        previous = FullyShardedDataParallel.set_state_dict_type(
            module, state_dict_type, state_dict_config, optim_state_dict_config)
        try:
            yield
        finally:
            for wrapper, rank0_only in previous:
                wrapper.rank0_only = rank0_only

    @staticmethod
    def set_state_dict_type(module, state_dict_type, state_dict_config=None,
                            optim_state_dict_config=None):
        if state_dict_type is not StateDictType.FULL_STATE_DICT:
            raise NotImplementedError(f"{state_dict_type}: spmdnet's FSDP state is the full "
                                      "state (StateDictType.FULL_STATE_DICT)")
        config = state_dict_config or FullStateDictConfig()
        wrappers = [m for m in module.modules() if isinstance(m, _StateDictMode)]
        if isinstance(module, _StateDictMode) and module not in wrappers:
            wrappers.append(module)  # FSDP holds its model outside its submodules
        previous = [(w, w.rank0_only) for w in wrappers]
        for wrapper in wrappers:
            wrapper.rank0_only = bool(getattr(config, "rank0_only", False))
        return previous


def _check(process_group, **options):
    if isinstance(process_group, tuple):
        raise NotImplementedError("FullyShardedDataParallel(process_group=(shard, replicate))"
                                  ": hybrid sharding is not supported by spmdnet")
    offload = options.pop("cpu_offload", None)
    _refuse(**options, cpu_offload=getattr(offload, "offload_params", offload) or None)
