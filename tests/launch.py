"""Start real MPI jobs from serial tests (for crash, abort and stall tests)."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mpiexec():
    """The mpiexec next to this Python (pip's mpich), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec found: pip install 'spmdnet[mpich]'")
    return found


def run_mpi(n, script, *args, timeout=60, env=None):
    """Run ``script`` on n ranks; returns (returncode, stdout, stderr, seconds)."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    cmd = [mpiexec(), "-n", str(n), sys.executable, str(script), *map(str, args)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=full_env, cwd=ROOT)
    finally:  # aborted jobs leave MPICH shared-memory segments in /dev/shm
        from spmdnet.distributed.slurm import clean_stale_mpich_segments
        clean_stale_mpich_segments()
    return proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - t0
