"""``torch.multiprocessing``'s path: ``spawn`` on MPI ranks.

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
from .processes import (ProcessContext, ProcessExitedException, ProcessException,
                        ProcessRaisedException, spawn, start_processes)

__all__ = ["spawn", "start_processes", "ProcessContext", "ProcessException",
           "ProcessRaisedException", "ProcessExitedException"]
