"""torchrun's environment under mpirun and srun, read without starting MPI.

A PyTorch program reads ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and
``LOCAL_WORLD_SIZE`` (torchrun sets them) before or after
``init_process_group``. ``import spmdnet`` calls ``set_torchrun_env``, which
sets the absent ones from the launcher's own variables: MPICH/Hydra
(``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``), Open
MPI (``OMPI_COMM_WORLD_*``), PMIx and Slurm steps (``SLURM_PROCID``,
``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_STEP_TASKS_PER_NODE``). A plain
``python`` process gets none (as without torchrun). ``launch.job_env``
drops them for a job started from inside another.
"""
import os

_RANK_KEYS = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
              ("PMIX_RANK", "PMIX_SIZE"))
_LOCAL_KEYS = (("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
               ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"))


def _number(key):
    value = os.environ.get(key, "")
    return int(value) if value.isdigit() else None


def _slurm_step():
    """Whether this process is a task of an srun step (not the batch script)."""
    step = os.environ.get("SLURM_STEP_ID", "")
    return step.isdigit() and int(step) < 2**31 and _number("SLURM_PROCID") is not None


def launched_rank_size():
    """(rank, size) from the launcher's variables, or (None, None) in a plain process."""
    for rank_key, size_key in _RANK_KEYS:
        if _number(rank_key) is not None:
            return _number(rank_key), _number(size_key)
    if _slurm_step():
        size = _number("SLURM_STEP_NUM_TASKS") or _number("SLURM_NTASKS")
        return _number("SLURM_PROCID"), size
    return None, None


def _slurm_tasks_on_this_node():
    """This node's task count from SLURM_STEP_TASKS_PER_NODE ("2(x3),1") and SLURM_NODEID."""
    counts = []
    for part in os.environ.get("SLURM_STEP_TASKS_PER_NODE",
                               os.environ.get("SLURM_TASKS_PER_NODE", "")).split(","):
        count, _, times = part.partition("(x")
        if count.isdigit():
            counts += [int(count)] * (int(times.rstrip(")")) if times.rstrip(")").isdigit()
                                      else 1)
    node = _number("SLURM_NODEID") or 0
    return counts[node] if node < len(counts) else None


def launched_local():
    """(local rank, ranks on this node) from the launcher's variables (None: unknown)."""
    for rank_key, size_key in _LOCAL_KEYS:
        if _number(rank_key) is not None:
            return _number(rank_key), _number(size_key)
    if _slurm_step() and _number("SLURM_LOCALID") is not None:
        return _number("SLURM_LOCALID"), _slurm_tasks_on_this_node()
    return None, None


def set_torchrun_env():
    """Set the absent torchrun variables from the launcher's (see the module
    docstring); returns the ones it set."""
    rank, size = launched_rank_size()
    if rank is None:
        return {}
    local_rank, local_size = launched_local()
    if size == 1:
        local_rank, local_size = 0, 1
    values = {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": local_rank,
              "LOCAL_WORLD_SIZE": local_size}
    added = {k: str(v) for k, v in values.items() if v is not None and k not in os.environ}
    os.environ.update(added)
    return added
