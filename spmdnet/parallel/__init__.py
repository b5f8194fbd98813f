"""Parallelism over MPI: data parallelism (later: tensor, pipeline, ZeRO)."""
from .data_parallel import DataParallel
from .explicit import allreduce_gradients

__all__ = ["DataParallel", "allreduce_gradients"]
