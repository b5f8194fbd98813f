"""Data parallelism: every rank holds the whole model, gradients are averaged.

- ``ddp``: ``DistributedDataParallel``, also named ``DataParallel`` (one
  class): a ``_common.grad_buffer.ParamAndGradBuffer`` that all-reduces;
- ``join``: uneven numbers of batches (``with ddp.join():``);
- ``explicit``: ``allreduce_gradients``, the hook-free way.
"""
from .ddp import DistributedDataParallel
from .explicit import allreduce_gradients
from .join import Join

DataParallel = DistributedDataParallel  # DESIGN's name: one class, DDP's meaning

__all__ = ["DataParallel", "DistributedDataParallel", "allreduce_gradients", "Join"]
