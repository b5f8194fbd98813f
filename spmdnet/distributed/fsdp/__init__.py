"""``torch.distributed.fsdp``: ``FullyShardedDataParallel`` (FSDP1, one
class: PyTorch's arguments and spmdnet's keyword-only ones), see
``fully_sharded_data_parallel``; the wrap policies are in ``wrap``."""
from .api import (BackwardPrefetch, CPUOffload, FullOptimStateDictConfig,
                  FullStateDictConfig, MixedPrecision, OptimStateDictConfig,
                  ShardedStateDictConfig, ShardingStrategy, StateDictConfig, StateDictType)
from .fully_sharded_data_parallel import FullyShardedDataParallel

__all__ = ["FullyShardedDataParallel", "ShardingStrategy", "BackwardPrefetch",
           "StateDictType", "CPUOffload", "MixedPrecision", "StateDictConfig",
           "FullStateDictConfig", "ShardedStateDictConfig", "OptimStateDictConfig",
           "FullOptimStateDictConfig"]
# PyTorch's FSDP2 (per-parameter DTensor shards), beside FSDP1 above
from ._fully_shard import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy,  # noqa: E402
                           OffloadPolicy, fully_shard)

__all__ += ["fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy",
            "CPUOffloadPolicy"]
