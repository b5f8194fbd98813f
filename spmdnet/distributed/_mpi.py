"""mpi4py's ``MPI`` module, imported on first use: the one import of mpi4py.

Importing ``mpi4py.MPI`` initialises MPI, so ``import spmdnet`` must not do
it: code anywhere in spmdnet that needs an MPI constant (``IN_PLACE``,
``SUM``) or class calls ``dist.mpi()``, never ``import mpi4py`` itself.
"""
import os
import sys


def _launcher_local_ranks():
    """Ranks on this node as the launcher says (before MPI is initialised)."""
    for key in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_STEP_NUM_TASKS"):
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value) if key != "SLURM_STEP_NUM_TASKS" or \
                os.environ.get("SLURM_STEP_NUM_NODES") == "1" else None
    return None


def _tune_for_oversubscription():
    """More ranks than cores: MPICH's busy polling starves the rank that has
    work to do. Throttled polling measured 9.5 s instead of 14.6 s for
    ``mpirun -n 8 python examples/train_mlp.py --tp 2 --pp 2`` on 2 cores.
    Only before MPI starts, and never over a user's own setting."""
    local = _launcher_local_ranks()
    if "mpi4py.MPI" not in sys.modules and local and local > (os.cpu_count() or 1):
        os.environ.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")


def mpi():
    """mpi4py's ``MPI`` module (the first call initialises MPI)."""
    if "mpi4py.MPI" not in sys.modules:
        _tune_for_oversubscription()
    from mpi4py import MPI  # noqa: PLC0415 - importing it initialises MPI: on first use only
    return MPI
