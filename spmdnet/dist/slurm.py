"""What Slurm says about this job (read from its environment variables)."""
import os


def describe_job():
    """A one-line description of the Slurm job, or None outside Slurm."""
    env = os.environ
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    parts = [f"Slurm job {job}"]
    if env.get("SLURM_ARRAY_TASK_ID"):
        parts.append(f"array task {env['SLURM_ARRAY_TASK_ID']}")
    for label, key in (("nodes", "SLURM_JOB_NUM_NODES"), ("nodelist", "SLURM_JOB_NODELIST"),
                       ("tasks", "SLURM_NTASKS"), ("tasks/node", "SLURM_TASKS_PER_NODE"),
                       ("cpus/task", "SLURM_CPUS_PER_TASK")):
        if env.get(key):
            parts.append(f"{label} {env[key]}")
    return ", ".join(parts)
