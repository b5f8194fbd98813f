"""Fully sharded data parallelism (ZeRO-3): ``FullyShardedDataParallel``.

- ``fully_sharded``: the wrapper (forward, backward's end, state, clipping);
- ``units``: ``Flat`` (one flat shard), ``Unit`` and ``UnitRun`` (a wrapped
  unit's gather / forward / recompute / reduce-scatter), the buffer ``Pool``;
- ``prefetch``: prefetching all-gathers and overlapped reduce-scatters;
- ``wrap``: the wrap policy, and the split of a unit into flats by dtype and
  optimizer options (``param_groups``);
- ``optim_state``: the full optimizer state with the original names.
"""
from .fully_sharded import FullyShardedDataParallel

__all__ = ["FullyShardedDataParallel"]
