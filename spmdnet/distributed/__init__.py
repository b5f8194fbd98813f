"""The MPI runtime: world, collectives on arrays, cross-rank checks.

mpi4py is imported on first use, so ``import spmdnet`` needs no MPI launch.

Besides the collectives, code that calls a communicator's own methods (the
parallel strategies, checkpoints, loaders) uses these public helpers so
that every such call is still watched, staged and tagged: ``guarded(op, comm)``
around the call (collective checks and the stall watchdog), ``on_host(arr,
fn)`` to hand a NumPy/CuPy buffer to MPI, ``mpi()`` for mpi4py's constants,
and ``bound_device()`` / ``rank_label()`` / ``is_initialized()``, which read
the world without initialising MPI.
"""
from ..errors import DistributedError
from ._mpi import mpi
from .checks import check_same
from ..kernels.compile_order import compile_in_order
from .collectives import allgather, allreduce, broadcast, on_host, reduce_scatter
from .guard import guarded
from .mesh import Mesh
from .signals import StopSignal, finalize_and_exit
from .runtime import (barrier, bound_device, comm_or_default, dup, free, get_logger, init,
                      is_initialized, is_root, local_rank, print0, rank, rank_label, size,
                      world)

__all__ = ["init", "world", "rank", "size", "local_rank", "is_root", "barrier", "print0",
           "get_logger", "allreduce", "broadcast", "allgather", "reduce_scatter",
           "check_same", "comm_or_default", "DistributedError", "Mesh", "StopSignal",
           "finalize_and_exit", "compile_in_order",
           # for code that calls raw communicator methods (spmdnet.parallel, data, ...)
           "guarded", "on_host", "mpi", "is_initialized", "bound_device", "rank_label",
           "dup", "free"]
