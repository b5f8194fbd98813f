"""Parallelism over MPI: data, tensor and pipeline parallelism, and the
ZeRO sharded optimizer."""
from .data_parallel import DataParallel
from .explicit import allreduce_gradients
from .tensor_parallel import (
                              ColumnParallelLinear,
                              ParallelDropout,
                              RowParallelLinear,
                              ShardedParameter,
                              gather_state_dict,
                              scatter_state_dict,
                              tp_rng_region,
)
from . import pipeline
from .pipeline import Pipeline
from .zero import ZeroRedundancyOptimizer
from .sync_batchnorm import SyncBatchNorm
from .. import nn as _nn
from .fsdp import FullyShardedDataParallel
from .tp_collectives import copy_to_group, gather_from_group, reduce_from_group, scatter_to_group
from .tp_transformer import (ParallelSelfAttention, VocabParallelEmbedding,
                             vocab_parallel_cross_entropy)

_nn.SyncBatchNorm = SyncBatchNorm  # PyTorch's name; nn (layer 5) cannot import parallel (7)

__all__ = ["DataParallel", "allreduce_gradients", "ColumnParallelLinear", "RowParallelLinear",
           "ParallelDropout", "ShardedParameter", "gather_state_dict", "scatter_state_dict",
           "tp_rng_region", "copy_to_group", "reduce_from_group", "gather_from_group",
           "scatter_to_group", "Pipeline", "ZeroRedundancyOptimizer", "pipeline", "SyncBatchNorm",
           "FullyShardedDataParallel", "ParallelSelfAttention", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy"]
