"""Tensor parallelism (Megatron-LM's layout over a tensor-parallel communicator).

- ``collectives``: the four autograd collectives (copy/reduce/gather/scatter
  to and from the group), each with its backward;
- ``layers``: ``ColumnParallelLinear``, ``RowParallelLinear``,
  ``ParallelDropout``, ``ShardedParameter``, shard helpers and the full
  ``gather_state_dict`` / ``scatter_state_dict``;
- ``transformer``: ``ParallelSelfAttention``, ``VocabParallelEmbedding`` and
  ``vocab_parallel_cross_entropy``.
"""
from .collectives import copy_to_group, gather_from_group, reduce_from_group, scatter_to_group
from .layers import (ColumnParallelLinear, ParallelDropout, RowParallelLinear, ShardedParameter,
                     TPModule, check_comm, gather_state_dict, join_shards, scatter_state_dict,
                     split_shard, tp_rng_region)
from .transformer import ParallelSelfAttention, VocabParallelEmbedding, vocab_parallel_cross_entropy

__all__ = ["copy_to_group", "gather_from_group", "reduce_from_group", "scatter_to_group",
           "ColumnParallelLinear", "ParallelDropout", "RowParallelLinear", "ShardedParameter",
           "TPModule", "check_comm", "gather_state_dict", "join_shards", "scatter_state_dict",
           "split_shard", "tp_rng_region", "ParallelSelfAttention", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy"]
