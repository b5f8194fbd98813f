"""Start real MPI jobs from serial tests (examples, crash, abort and stall
tests) with the launcher rule of ``spmdnet.launch``."""
import importlib.util
import sys
import time
from pathlib import Path

from spmdnet import launch
from spmdnet.distributed.slurm import clean_stale_mpich_segments

ROOT = Path(__file__).resolve().parents[2]
mpiexec = launch.mpiexec


def run_mpi(n, script, *args, timeout=60, env=None):
    """Run ``script`` (a path, or ``"-m", module``) with ``args`` on n ranks
    from the repository root, one thread per rank, ``env`` added to this
    environment; returns (returncode, stdout, stderr, seconds)."""
    t0 = time.perf_counter()
    try:
        proc = launch.run(n, script, *args, env=env, timeout=timeout, cwd=ROOT)
    finally:  # aborted jobs leave MPICH shared-memory segments in /dev/shm
        clean_stale_mpich_segments()
    return proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - t0


def load_example(name):
    """examples/<name>.py as a module (its main() not run), with examples/ on
    the path as when the script runs (train_3d.py imports train_mlp.py)."""
    if str(ROOT / "examples") not in sys.path:
        sys.path.insert(0, str(ROOT / "examples"))
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / f"examples/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
