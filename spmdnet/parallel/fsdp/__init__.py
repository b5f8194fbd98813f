"""Fully sharded data parallelism (ZeRO-3): ``FullyShardedDataParallel``.

- ``fully_sharded``: the wrapper (forward, backward's end, state, clipping);
- ``units``: ``Flat`` (one flat shard), ``Unit`` and ``UnitRun`` (a wrapped
  unit's gather / forward / recompute), the buffer ``Pool``;
- ``prefetch``: prefetching all-gathers (the gradients' reduce-scatters are
  the ``_common.grad_buffer`` buckets, as DataParallel's and ZeRO's);
- ``wrap``: the wrap policy, and the split of a unit into flats by dtype and
  optimizer options (``param_groups``);
- ``optim_state``: the full optimizer state with the original names.
"""
from .fully_sharded import FullyShardedDataParallel

__all__ = ["FullyShardedDataParallel"]
