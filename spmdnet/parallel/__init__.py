"""Parallelism over MPI, one sub-package per strategy, each owning its state:

- ``data_parallel``: ``DataParallel`` (with ``join``), ``allreduce_gradients``;
- ``fsdp``: ``FullyShardedDataParallel`` (ZeRO-3);
- ``zero``: ``ZeroRedundancyOptimizer`` (ZeRO stages 1 and 2);
- ``tensor_parallel``: Megatron-style layers and their collectives;
- ``pipeline``: ``Pipeline`` (GPipe);
- ``sync_batchnorm``: ``SyncBatchNorm`` (also ``spmdnet.nn.SyncBatchNorm``);
- ``_common``: what they share (flat layout, wrap-time checks, the backward
  sentinel, non-finite agreement, the cross-rank gradient norm behind
  ``clip_grad_norm_``).
"""
from . import pipeline
from ._common.norm import clip_grad_norm_
from .data_parallel import DataParallel, allreduce_gradients
from .fsdp import FullyShardedDataParallel
from .pipeline import Pipeline
from .sync_batchnorm import SyncBatchNorm
from .tensor_parallel import (ColumnParallelLinear, ParallelDropout, ParallelSelfAttention,
                              RowParallelLinear, ShardedParameter, VocabParallelEmbedding,
                              copy_to_group, gather_from_group, gather_state_dict,
                              reduce_from_group, scatter_state_dict, scatter_to_group,
                              tp_rng_region, vocab_parallel_cross_entropy)
from .zero import ZeroRedundancyOptimizer

__all__ = ["DataParallel", "allreduce_gradients", "ColumnParallelLinear", "RowParallelLinear",
           "ParallelDropout", "ShardedParameter", "gather_state_dict", "scatter_state_dict",
           "tp_rng_region", "copy_to_group", "reduce_from_group", "gather_from_group",
           "scatter_to_group", "Pipeline", "ZeroRedundancyOptimizer", "pipeline", "SyncBatchNorm",
           "FullyShardedDataParallel", "ParallelSelfAttention", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy", "clip_grad_norm_"]
