"""What Slurm says about this job, read from its environment variables, and the
clean-up a requeued MPICH job needs. Imports neither mpi4py nor Slurm tools.

    python -m spmdnet.distributed.slurm               # describe the job (or "not under Slurm")
    python -m spmdnet.distributed.slurm --clean-shm   # remove this user's stale MPICH segments
"""
import os
import sys
from pathlib import Path

LAUNCH_HINT = ("the MPI library does not talk to Slurm's process manager: launch with "
               "`srun --mpi=pmi2` for MPICH or Intel MPI, `srun --mpi=pmix` for Open MPI "
               "(`srun --mpi=list` shows what this Slurm offers)")


def describe_job(world_size=None, env=None):
    """One line about the Slurm job and step this process runs in, or None
    outside Slurm: job id (array task, name, restarts), step, nodes, tasks
    per node, CPUs and GPUs per task, partition.

    ``world_size`` defaults to MPI.COMM_WORLD's when mpi4py has initialised
    MPI; when srun started several tasks but MPI sees a world of one (every
    task is a separate singleton, training alone), the line says so."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    step = lambda key: env.get(f"SLURM_STEP_{key}") or env.get(f"SLURM_{key}")  # step first
    head = f"Slurm job {job}"
    if env.get("SLURM_ARRAY_TASK_ID"):
        head += f" (array {env.get('SLURM_ARRAY_JOB_ID', '?')}_{env['SLURM_ARRAY_TASK_ID']})"
    if env.get("SLURM_JOB_NAME"):
        head += f" '{env['SLURM_JOB_NAME']}'"
    if env.get("SLURM_STEP_ID"):
        head += f" step {env['SLURM_STEP_ID']}"
    if env.get("SLURM_RESTART_COUNT", "0") != "0":
        head += f", requeued {env['SLURM_RESTART_COUNT']}x"
    parts = []
    nodes = step("NUM_NODES") or env.get("SLURM_JOB_NUM_NODES")
    nodelist = step("NODELIST") or env.get("SLURM_JOB_NODELIST")
    if nodes:
        parts.append(f"{nodes} node{'' if nodes == '1' else 's'}"
                     + (f" ({nodelist})" if nodelist else ""))
    tasks = step("NUM_TASKS") or env.get("SLURM_NTASKS")
    if tasks:
        parts.append(f"{tasks} tasks")
    if step("TASKS_PER_NODE"):
        parts.append(f"tasks/node {step('TASKS_PER_NODE')}")
    for label, key in (("CPUs/task", "SLURM_CPUS_PER_TASK"), ("GPUs/task", "SLURM_GPUS_PER_TASK"),
                       ("GPUs/node", "SLURM_GPUS_ON_NODE"), ("partition", "SLURM_JOB_PARTITION")):
        if env.get(key):
            parts.append(f"{label} {env[key]}")
    line = head + (": " + ", ".join(parts) if parts else "")
    if world_size is None:
        world_size = _mpi_world_size()
    step_tasks = env.get("SLURM_STEP_NUM_TASKS", "")
    if world_size == 1 and step_tasks.isdigit() and int(step_tasks) > 1:
        line += (f"; WARNING: srun started {step_tasks} tasks but MPI sees a world of 1, "
                 f"so each task trains alone: {LAUNCH_HINT}")
    return line


def _mpi_world_size():
    """COMM_WORLD's size when mpi4py has initialised MPI, else None."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    return mpi.COMM_WORLD.Get_size()


# -- stale MPICH shared memory ----------------------------------------------------------
# MPICH names a node's shared-memory segment after a hash of the PMI job name, which
# under Slurm is "<job id>.<step id>". A requeued job keeps its id and counts steps
# from 0 again, so its first step opens the segment that its killed predecessor left in
# /dev/shm, finds it "ready", and hangs at start-up. Removing segments that no process
# maps any more before the step starts avoids that.
def stale_mpich_segments(directory="/dev/shm", prefix="mpich_"):
    """This user's MPICH shared-memory files in ``directory`` that no running
    process has open or mapped (left behind by killed or aborted ranks)."""
    base = Path(directory).resolve()
    if not base.is_dir():
        return []
    uid = os.getuid()
    candidates = []
    for path in base.iterdir():
        try:
            if path.name.startswith(prefix) and path.is_file() and path.stat().st_uid == uid:
                candidates.append(path)
        except OSError:  # removed meanwhile
            continue
    if not candidates:
        return []
    in_use = _paths_in_use()
    return sorted(p for p in candidates if str(p) not in in_use)


def _paths_in_use():
    """Every file path that a process we can inspect maps or holds open."""
    used = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            with open(proc / "maps") as f:
                for line in f:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6:
                        used.add(fields[5].rstrip("\n").removesuffix(" (deleted)"))
            for fd in (proc / "fd").iterdir():
                used.add(os.readlink(fd))
        except OSError:  # gone, or not ours
            continue
    return used


def clean_stale_mpich_segments(directory="/dev/shm"):
    """Remove :func:`stale_mpich_segments`; returns the paths removed."""
    from .. import launch  # noqa: PLC0415 - `python -m spmdnet.launch` needs it unimported
    return launch.unlink_existing(stale_mpich_segments(directory))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--clean-shm"]:
        removed = clean_stale_mpich_segments()
        if removed:  # quiet when there was nothing to do
            print(f"{os.uname().nodename}: removed {len(removed)} stale MPICH shared-memory "
                  f"segment(s): {' '.join(p.name for p in removed)}", flush=True)
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    print(describe_job() or "not running under Slurm (no SLURM_JOB_ID)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
