"""``FullyShardedDataParallel``'s PyTorch arguments turned into spmdnet's
configuration: the communicator, whether units reshard after forward, which
modules are units, which gathers are prefetched, and the arguments whose
features spmdnet does not build (NotImplementedError naming them)."""
import numpy as np

from ..._tensor import Tensor
from ...dtypes import is_floating
from .. import c10d
from .api import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
from .wrap import as_wrap, policy

# (strategy -> reshard after forward); NO_SHARD is DistributedDataParallel
RESHARD = {ShardingStrategy.FULL_SHARD: True, ShardingStrategy.SHARD_GRAD_OP: False}
UNBUILT = ("ignored_modules", "param_init_fn", "ignored_states", "device_mesh")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def check_unbuilt(process_group, **options):
    """NotImplementedError for a hybrid ``process_group`` pair or any of the
    ``UNBUILT`` options set."""
    if isinstance(process_group, tuple):
        raise NotImplementedError("FullyShardedDataParallel(process_group=(shard, replicate))"
                                  ": hybrid sharding is not supported by spmdnet")
    for name, value in options.items():
        if value is not None and value is not False:
            raise NotImplementedError(f"FullyShardedDataParallel({name}={value!r}) is not "
                                      "supported by spmdnet")


def strategy_of(sharding_strategy):
    """The ``ShardingStrategy`` (None: FULL_SHARD); HYBRID ones raise."""
    strategy = ShardingStrategy.FULL_SHARD if sharding_strategy is None else sharding_strategy
    if not isinstance(strategy, ShardingStrategy):
        raise TypeError(f"sharding_strategy must be a ShardingStrategy, got {strategy!r}")
    if strategy not in RESHARD and strategy is not ShardingStrategy.NO_SHARD:
        raise NotImplementedError(
            f"sharding_strategy={strategy}: spmdnet shards over one process group; use "
            "FULL_SHARD, SHARD_GRAD_OP or NO_SHARD (or a 2-D layout with dist.Mesh)")
    return strategy


def comm_of(process_group, comm):
    """The communicator: ``process_group`` (a group or a communicator) or
    spmdnet's ``comm``; None: the world."""
    if process_group is not None and comm is not None:
        raise ValueError("FullyShardedDataParallel: pass comm or process_group, not both")
    return comm if comm is not None else c10d.comm_of(process_group, "FullyShardedDataParallel")


def reshard_of(strategy, reshard_after_forward):
    """``reshard_after_forward`` (spmdnet's) or the strategy's; they must agree."""
    by_strategy = RESHARD[strategy]
    if reshard_after_forward is None:
        return by_strategy
    if bool(reshard_after_forward) != by_strategy and strategy is not ShardingStrategy.FULL_SHARD:
        raise ValueError(f"FullyShardedDataParallel: reshard_after_forward="
                         f"{reshard_after_forward!r} contradicts sharding_strategy={strategy} "
                         "(pass one of them)")
    return bool(reshard_after_forward)


def unit_policy(module, auto_wrap_policy, wrap):
    """``module -> bool`` (is it its own unit) from PyTorch's ``auto_wrap_policy``
    or spmdnet's ``wrap`` (module classes or a predicate), not both."""
    if auto_wrap_policy is not None and wrap is not None:
        raise ValueError("FullyShardedDataParallel: pass auto_wrap_policy or wrap, not both")
    if auto_wrap_policy is not None:
        return as_wrap(module, auto_wrap_policy)
    return policy(wrap)


def prefetch_modes(forward_prefetch, backward_prefetch, prefetch):
    """(forward: bool, backward: "pre", "post" or None) of the ``Prefetcher``.
    spmdnet's ``prefetch`` is shorthand: True for ``forward_prefetch=True,
    backward_prefetch=BACKWARD_PRE``, False for ``forward_prefetch=False,
    backward_prefetch=None``; None: PyTorch's two flags decide. A flag set
    against it raises ValueError (none is ignored)."""
    if backward_prefetch is not None and not isinstance(backward_prefetch, BackwardPrefetch):
        raise TypeError(f"backward_prefetch must be a BackwardPrefetch or None, got "
                        f"{backward_prefetch!r}")
    if prefetch is True:
        if backward_prefetch is not BackwardPrefetch.BACKWARD_PRE:
            raise ValueError(f"FullyShardedDataParallel: prefetch=True prefetches with "
                             f"BACKWARD_PRE; backward_prefetch={backward_prefetch} contradicts it")
        return True, "pre"
    if prefetch is False:
        if forward_prefetch or backward_prefetch is BackwardPrefetch.BACKWARD_POST:
            raise ValueError(f"FullyShardedDataParallel: prefetch=False contradicts "
                             f"forward_prefetch={forward_prefetch!r}, backward_prefetch="
                             f"{backward_prefetch}")
        return False, None
    if prefetch is not None:
        raise TypeError(f"prefetch must be True, False or None, got {prefetch!r}")
    backward = {None: None, BackwardPrefetch.BACKWARD_PRE: "pre",
                BackwardPrefetch.BACKWARD_POST: "post"}[backward_prefetch]
    return bool(forward_prefetch), backward


def offload_of(cpu_offload):
    """Whether the shards live on the host (``CPUOffload(offload_params=True)``)."""
    if cpu_offload is None:
        return False
    if not isinstance(cpu_offload, CPUOffload):
        raise TypeError(f"cpu_offload must be a CPUOffload or None, got {cpu_offload!r}")
    return bool(cpu_offload.offload_params)


def _dtype(name, value):
    if value is None:
        return None
    dtype = np.dtype(value)
    if dtype.name not in FLOAT_DTYPES:
        raise TypeError(f"MixedPrecision({name}={value!r}): one of {FLOAT_DTYPES}")
    return dtype


def precision_of(mixed_precision):
    """``MixedPrecision`` -> a ``MixedPrecision`` of NumPy dtypes (None:
    full precision everywhere), ``reduce_dtype`` defaulting to ``param_dtype``
    as PyTorch's."""
    if mixed_precision is None:
        return MixedPrecision()
    if not isinstance(mixed_precision, MixedPrecision):
        raise TypeError(f"mixed_precision must be a MixedPrecision or None, got "
                        f"{mixed_precision!r}")
    mp = mixed_precision
    param = _dtype("param_dtype", mp.param_dtype)
    reduce = _dtype("reduce_dtype", mp.reduce_dtype)
    return MixedPrecision(param_dtype=param, reduce_dtype=param if reduce is None else reduce,
                          buffer_dtype=_dtype("buffer_dtype", mp.buffer_dtype),
                          keep_low_precision_grads=bool(mp.keep_low_precision_grads),
                          cast_forward_inputs=bool(mp.cast_forward_inputs),
                          cast_root_forward_inputs=bool(mp.cast_root_forward_inputs))


def cast_inputs(dtype, args, kwargs):
    """Floating-point Tensors among ``args`` and ``kwargs``' values cast to
    ``dtype`` (a differentiable cast; None: unchanged)."""
    def cast(a):
        if dtype is None or not isinstance(a, Tensor) or a.dtype == dtype or \
                not is_floating(a.dtype):
            return a
        return a.to(dtype)
    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}
