"""Parallelism over MPI: data parallelism and tensor parallelism (later:
pipeline, ZeRO)."""
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
from .tp_collectives import copy_to_group, gather_from_group, reduce_from_group, scatter_to_group

__all__ = ["DataParallel", "allreduce_gradients", "ColumnParallelLinear", "RowParallelLinear",
           "ParallelDropout", "ShardedParameter", "gather_state_dict", "scatter_state_dict",
           "tp_rng_region", "copy_to_group", "reduce_from_group", "gather_from_group",
           "scatter_to_group"]
