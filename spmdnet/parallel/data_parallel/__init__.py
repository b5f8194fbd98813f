"""Data parallelism: every rank holds the whole model, gradients are averaged.

- ``ddp``: ``DataParallel`` (PyTorch's DistributedDataParallel semantics)
  and ``DistributedDataParallel`` (the same class with PyTorch's arguments);
- ``buckets``: the flat gradient buckets its ``.grad`` tensors are views of;
- ``reducer``: how bucket allreduces overlap backward;
- ``join``: uneven numbers of batches (``with ddp.join():``);
- ``explicit``: ``allreduce_gradients``, the hook-free way.
"""
from .ddp import DataParallel, DistributedDataParallel
from .explicit import allreduce_gradients
from .join import Join

__all__ = ["DataParallel", "DistributedDataParallel", "allreduce_gradients", "Join"]
