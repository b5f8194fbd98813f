"""``torch.distributed.fsdp``'s path: PyTorch's arguments on spmdnet's
``FullyShardedDataParallel`` (``spmdnet.parallel.fsdp``), see
``fully_sharded_data_parallel``; the wrap policies are in ``wrap``."""
from .api import (BackwardPrefetch, CPUOffload, FullOptimStateDictConfig,
                  FullStateDictConfig, MixedPrecision, OptimStateDictConfig,
                  ShardedStateDictConfig, ShardingStrategy, StateDictConfig, StateDictType)
from .fully_sharded_data_parallel import FullyShardedDataParallel

__all__ = ["FullyShardedDataParallel", "ShardingStrategy", "BackwardPrefetch",
           "StateDictType", "CPUOffload", "MixedPrecision", "StateDictConfig",
           "FullStateDictConfig", "ShardedStateDictConfig", "OptimStateDictConfig",
           "FullOptimStateDictConfig"]
