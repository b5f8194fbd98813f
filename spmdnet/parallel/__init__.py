"""Parallelism over MPI, one sub-package per strategy, each owning its state:

- ``tensor_parallel``: Megatron-style layers and their collectives;
- ``pipeline``: ``Pipeline`` (GPipe);
- ``sync_batchnorm``: ``SyncBatchNorm`` (also ``spmdnet.nn.SyncBatchNorm``);
- ``_common``: what they share (the ``ParamAndGradBuffer``, flat layout,
  wrap-time checks, the backward sentinel, non-finite agreement, the
  cross-rank gradient norm behind ``clip_grad_norm_``).

The strategies PyTorch has live at PyTorch's paths and are named here too,
the same objects: ``DataParallel`` (``DistributedDataParallel``) and
``allreduce_gradients`` from ``spmdnet.nn.parallel.distributed``,
``ZeroRedundancyOptimizer`` (stages 1 and 2) from ``spmdnet.distributed.optim``,
``FullyShardedDataParallel`` (ZeRO-3) from ``spmdnet.distributed.fsdp``.
They build on ``_common``, so this package imports nothing when it loads (a
module importing ``parallel._common`` runs this file first): each name is
imported on first access (PEP 562), and ``import spmdnet`` loads them all.
"""
__all__ = ["DataParallel", "allreduce_gradients", "ColumnParallelLinear", "RowParallelLinear",
           "ParallelDropout", "ShardedParameter", "gather_state_dict", "scatter_state_dict",
           "tp_rng_region", "copy_to_group", "reduce_from_group", "gather_from_group",
           "scatter_to_group", "Pipeline", "ZeroRedundancyOptimizer", "pipeline", "SyncBatchNorm",
           "FullyShardedDataParallel", "ParallelSelfAttention", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy", "clip_grad_norm_"]

_TENSOR_PARALLEL = {"ColumnParallelLinear", "ParallelDropout", "ParallelSelfAttention",
                    "RowParallelLinear", "ShardedParameter", "VocabParallelEmbedding",
                    "copy_to_group", "gather_from_group", "gather_state_dict",
                    "reduce_from_group", "scatter_state_dict", "scatter_to_group",
                    "tp_rng_region", "vocab_parallel_cross_entropy"}


def _resolve(name):
    """The object ``name`` names, its module imported now (each import below
    runs on first access: PEP 562); None: not a name of ours."""
    if name in ("DataParallel", "DistributedDataParallel"):
        # DataParallel: DESIGN's name of the one data-parallel class, DDP's meaning
        from ..nn.parallel.distributed import DistributedDataParallel  # noqa: PLC0415
        return DistributedDataParallel
    if name == "allreduce_gradients":
        from ..nn.parallel.distributed import allreduce_gradients  # noqa: PLC0415
        return allreduce_gradients
    if name == "ZeroRedundancyOptimizer":
        from ..distributed.optim import zero_redundancy_optimizer as zero  # noqa: PLC0415
        return zero.ZeroRedundancyOptimizer
    if name == "FullyShardedDataParallel":
        from ..distributed.fsdp import fully_sharded_data_parallel as fsdp  # noqa: PLC0415
        return fsdp.FullyShardedDataParallel
    if name in ("Pipeline", "pipeline"):
        from .pipeline import Pipeline  # noqa: PLC0415 - binds the sub-package here too
        return Pipeline if name == "Pipeline" else globals()["pipeline"]
    if name == "SyncBatchNorm":
        from .sync_batchnorm import SyncBatchNorm  # noqa: PLC0415
        return SyncBatchNorm
    if name == "clip_grad_norm_":
        from ._common.norm import clip_grad_norm_  # noqa: PLC0415
        return clip_grad_norm_
    if name in _TENSOR_PARALLEL:
        from . import tensor_parallel  # noqa: PLC0415
        return getattr(tensor_parallel, name)
    return None


def __getattr__(name):
    value = _resolve(name)
    if value is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # resolved once
    return value


def __dir__():
    return sorted({*globals(), *__all__})
