"""``torch.multiprocessing``'s path: Python's ``multiprocessing`` with
tensor sharing, and ``spawn`` on MPI ranks.

- Everything of Python's ``multiprocessing`` (``Process``, ``Queue``,
  ``Pool``, ``get_context``, ``set_start_method``, ``get_start_method``,
  ...), as PyTorch re-exports it; a tensor in shared memory
  (``Tensor.share_memory_()``, ``Module.share_memory()``) passed to a
  process or put on a queue arrives as the same memory (``reductions``), so
  a Hogwild trainer (processes updating one shared model, each with its own
  optimizer) runs as with PyTorch;
- inside an MPI job (``mpirun -n N``, ``srun``, ``python -m spmdnet.run``)
  of ``nprocs`` ranks, ``spawn(fn, args, nprocs)`` calls ``fn(rank, *args)``
  on each rank: the ranks already exist, so the code around ``spawn`` also
  runs on every rank (SPMD; PyTorch runs it once, in the parent);
- from a plain ``python`` process with ``nprocs > 1`` it starts ``nprocs``
  MPI ranks under ``mpiexec`` (``spmdnet.launch``) whose entry imports the
  main script as ``__mp_main__`` (so ``if __name__ == "__main__":`` code runs
  once, in the parent, as with PyTorch's) and calls ``fn(rank, *args)``.
  See ``processes.py`` for errors, signals and exit codes.
"""
import multiprocessing
from multiprocessing import *  # noqa: F403 - PyTorch re-exports Python's multiprocessing

from .processes import (ProcessContext, ProcessExitedException, ProcessException,
                        ProcessRaisedException, spawn, start_processes)
from .reductions import init_reductions

init_reductions()

__all__ = ["spawn", "start_processes", "ProcessContext", "ProcessException",
           "ProcessRaisedException", "ProcessExitedException", "init_reductions",
           *multiprocessing.__all__]
