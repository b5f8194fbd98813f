"""The MPI runtime: world, collectives on arrays, cross-rank checks.

mpi4py is imported on first use, so ``import spmdnet`` needs no MPI launch.

Besides the collectives, code that calls a communicator's own methods (the
parallel strategies, checkpoints, loaders) uses these public helpers so
that every such call is still watched, staged and tagged: ``guarded(op, comm)``
around the call (collective checks and the stall watchdog), ``on_host(arr,
fn)`` to hand a NumPy/CuPy buffer to MPI, ``mpi()`` for mpi4py's constants,
and ``bound_device()`` / ``rank_label()`` / ``is_initialized()``, which read
the world without initialising MPI.

PyTorch's torch.distributed API sits on the same world (``c10d``: process
groups, ``init_process_group``; ``c10d_collectives``, ``c10d_p2p``,
``c10d_objects``). Where both APIs have a collective of one name, the name is
PyTorch's (``broadcast(tensor, src, group)``, ``reduce_scatter(output,
input_list, op, group)``, ``barrier(group)``): spmdnet's own array
collectives over communicators are ``allreduce``, ``allgather``, ``bcast``,
``reduce_scatter_block`` and ``comm_barrier``.
"""
from ..errors import DistributedError
from ._mpi import mpi
from .checks import check_same
from ..kernels.compile_order import compile_in_order
from .collectives import allgather, allreduce, bcast, on_host, reduce_scatter_block
from .guard import guarded
from .mesh import Mesh
from .signals import StopSignal, finalize_and_exit
from .runtime import (bound_device, comm_barrier, comm_or_default, dup, free, get_logger, init,
                      is_root, local_rank, print0, rank, rank_label, size, world)
from .c10d import (GroupMember, ProcessGroup, ReduceOp, comm_of, destroy_process_group,
                   get_backend, get_global_rank, get_group_rank, get_process_group_ranks,
                   get_rank, get_world_size, group, init_process_group, is_available,
                   is_gloo_available, is_initialized, is_mpi_available, is_nccl_available,
                   is_torchelastic_launched, new_group)
from .c10d_collectives import (all_gather, all_gather_into_tensor, all_reduce, all_to_all,
                               all_to_all_single, barrier, broadcast, gather, reduce,
                               reduce_scatter, reduce_scatter_tensor, scatter)
from .c10d_objects import (all_gather_object, broadcast_object_list, gather_object,
                           scatter_object_list)
from .c10d_p2p import P2POp, Work, batch_isend_irecv, irecv, isend, recv, send

__all__ = ["init", "world", "rank", "size", "local_rank", "is_root", "comm_barrier", "print0",
           "get_logger", "allreduce", "bcast", "allgather", "reduce_scatter_block",
           "check_same", "comm_or_default", "DistributedError", "Mesh", "StopSignal",
           "finalize_and_exit", "compile_in_order",
           # for code that calls raw communicator methods (spmdnet.parallel, data, ...)
           "guarded", "on_host", "mpi", "is_initialized", "bound_device", "rank_label",
           "dup", "free",
           # torch.distributed (c10d*.py)
           "init_process_group", "destroy_process_group", "is_available", "is_mpi_available",
           "is_gloo_available", "is_nccl_available", "is_torchelastic_launched",
           "get_rank", "get_world_size", "get_backend", "new_group", "group", "GroupMember",
           "ProcessGroup", "ReduceOp", "get_process_group_ranks", "get_global_rank",
           "get_group_rank", "all_reduce", "reduce", "broadcast", "all_gather",
           "all_gather_into_tensor", "reduce_scatter", "barrier",
           "gather", "scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
           "send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv", "Work",
           "broadcast_object_list", "all_gather_object", "gather_object",
           "scatter_object_list", "comm_of"]
