"""The MPI runtime: world, collectives on arrays, cross-rank checks.

mpi4py is imported on first use, so ``import spmdnet`` needs no MPI launch.
"""
from ..errors import DistributedError
from .checks import check_same
from .collectives import allgather, allreduce, broadcast, reduce_scatter
from .mesh import Mesh
from .signals import StopSignal
from .world import (barrier, comm_or_default, get_logger, init, is_root, local_rank,
                    print0, rank, size, world)

__all__ = ["init", "world", "rank", "size", "local_rank", "is_root", "barrier", "print0",
           "get_logger", "allreduce", "broadcast", "allgather", "reduce_scatter",
           "check_same", "comm_or_default", "DistributedError", "Mesh", "StopSignal"]
