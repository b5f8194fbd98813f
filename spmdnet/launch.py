"""Start MPI jobs from Python or a shell script: the one rule that finds the
launcher and sets one thread per rank, used by the benchmarks, ``python -m
spmdnet.bench scaling``, the tests and ``tests/run.sh``.

- launcher: ``srun`` inside a Slurm job (when asked for), else the ``mpiexec``
  of the running Python's environment (pip's mpich), else PATH's (with
  ``--oversubscribe`` for Open MPI, which refuses more ranks than cores);
- environment: one OpenMP/OpenBLAS/MKL/Numba thread per rank (ranks share the
  cores), unbuffered output, and none of an outer launcher's variables, so a
  job started from inside another job is a job of its own.

    python -m spmdnet.launch --shell   # prints `export ... MPIEXEC=...` for a shell's eval
"""
import argparse
import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "NUMBA_NUM_THREADS")
LAUNCHER_ENV = ("PMI_", "PMIX_", "HYDRA_", "HYDI_", "OMPI_", "MPI_LOCALNRANKS",
                "MPI_LOCALRANKID")
# torchrun's variables (set by spmdnet at import under a launcher), and the pid that owns
# the early-failure hook (distributed/early_failure.py): a new job sets its own
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                "SPMDNET_EARLY_FAILURE_PID")


def mpiexec():
    """The mpiexec next to this Python (pip's mpich), else mpiexec or mpirun on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise RuntimeError(f"no mpiexec next to {sys.executable} nor on PATH: "
                           "pip install 'spmdnet[mpich]'")
    return found


@functools.cache
def _is_open_mpi(path):
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    return "Open MPI" in version or "OpenRTE" in version


def launcher(srun=False):
    """The command before ``-n N``: ``["srun"]`` in a Slurm job when ``srun``,
    else ``[mpiexec()]`` (plus ``--oversubscribe`` for Open MPI)."""
    if srun and os.environ.get("SLURM_JOB_ID") and shutil.which("srun"):
        return ["srun"]
    found = mpiexec()
    return [found, "--oversubscribe"] if _is_open_mpi(found) else [found]


def job_env(base=None, **extra):
    """``base`` (default: this environment) without an outer launcher's
    variables (torchrun's RANK, WORLD_SIZE ... included), with one thread
    per rank and unbuffered output, then ``extra``."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items()
           if not k.startswith(LAUNCHER_ENV) and k not in TORCHRUN_ENV}
    env.update(dict.fromkeys(THREAD_VARS, "1"), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def command(n, *args, prefix=None):
    """``[*prefix, "-n", n, python, *args]``: this Python on n ranks
    (``prefix`` default: ``launcher()``)."""
    return [*(prefix or launcher()), "-n", str(n), sys.executable, *map(str, args)]


def run(n, *args, prefix=None, env=None, **kwargs):
    """``subprocess.run`` of ``command(n, *args)`` in ``job_env(**env)``;
    keyword arguments go to ``subprocess.run`` (default: text output captured).
    Afterwards, MPICH's stale topology files are removed (``clean_topology_files``)."""
    kwargs = {"capture_output": True, "text": True, **kwargs}
    try:
        return subprocess.run(command(n, *args, prefix=prefix), env=job_env(**(env or {})),
                              **kwargs)
    finally:
        clean_topology_files()


# MPICH's process manager (Hydra) writes the node's hwloc topology to
# /tmp/hydra_hwloc_xmlfile_XXXXXX (a fixed path: TMPDIR is not read; no flag
# or variable turns it off) the first time a rank asks for it in MPI_Init,
# keeps it open and deletes it when its proxy exits normally. A job ended by
# MPI_Abort or a signal kills the proxy first, and the file stays for good.
TOPOLOGY_FILES = ("/tmp", "hydra_hwloc_xmlfile_")


def stale_topology_files(directory=TOPOLOGY_FILES[0], prefix=TOPOLOGY_FILES[1]):
    """This user's Hydra topology files in ``directory`` that no process holds
    open any more (a running job's proxy keeps its own open)."""
    base = Path(directory)
    uid = os.getuid()
    try:
        candidates = [p for p in base.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return []
    candidates = [p for p in candidates if _owned(p, uid)]
    if not candidates:
        return []
    held = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                held.update(os.readlink(fd) for fd in (proc / "fd").iterdir())
            except OSError:  # gone, or not ours
                continue
    return sorted(p for p in candidates if str(p) not in held)


def _owned(path, uid):
    try:
        return path.is_file() and path.stat().st_uid == uid
    except OSError:  # removed meanwhile
        return False


def unlink_existing(paths):
    """Remove each path that still exists (another process may have removed it
    meanwhile); returns the paths this call removed."""
    removed = []
    for path in paths:
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            continue
    return removed


def clean_topology_files(directory=TOPOLOGY_FILES[0]):
    """Remove ``stale_topology_files``; returns the paths removed."""
    return unlink_existing(stale_topology_files(directory))


def run_child(n, script, *args):
    """Run ``script --child *args`` on n ranks (a benchmark launching itself);
    the JSON value of the last line it printed (rank 0's result). A failed
    job raises ``CalledProcessError``."""
    out = run(n, script, "--child", *args, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def launched_size():
    """The number of ranks this process was launched with (1 when plain)."""
    for key in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    step = os.environ.get("SLURM_STEP_ID", "")
    if step.isdigit() and int(step) < 2**31:  # a real srun step, not the batch script
        return int(os.environ.get("SLURM_STEP_NUM_TASKS", "1"))
    return 1


def launched_rank():
    """This process's rank from the launcher's environment (0 when plain)."""
    for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return int(os.environ.get("SLURM_PROCID", "0")) if launched_size() > 1 else 0


def shell_exports():
    """The thread settings and ``MPIEXEC`` (``mpiexec()``) as one ``export``
    line for a shell."""
    values = {**dict.fromkeys(THREAD_VARS, "1"), "PYTHONUNBUFFERED": "1",
              "MPIEXEC": mpiexec()}
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in values.items())


def rerun_with_threads(script, threads, *args):
    """Run ``python script *args`` once per BLAS thread count in ``threads``
    (a fresh process each: BLAS reads its thread count at import)."""
    for n in threads:
        env = dict(os.environ, **dict.fromkeys(THREAD_VARS, str(n)))
        subprocess.run([sys.executable, str(script), *map(str, args)], env=env, check=True)


def thread_sweep(script, doc, child, header, threads=(1,), steps=30, options=None):
    """The ``main()`` of a benchmark timed per BLAS thread count: options
    ``--steps`` and ``--threads``; prints ``header(steps)``, then runs
    ``child(steps)`` in a fresh ``script --child`` process per thread count.
    ``options``: the benchmark's own, ``{"--name": (type, default, help)}``
    with a type that reads back its own ``str`` (int, float, str: no bool),
    handed to ``header`` and ``child`` as keywords (``name``) and forwarded
    to every child process."""
    options = options or {}
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--threads", type=int, nargs="+", default=list(threads))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for flag, (kind, default, text) in options.items():
        parser.add_argument(flag, type=kind, default=default, help=text)
    args = parser.parse_args()
    own = {flag: getattr(args, flag.lstrip("-").replace("-", "_")) for flag in options}
    keywords = {flag.lstrip("-").replace("-", "_"): value for flag, value in own.items()}
    if args.child:
        return child(args.steps, **keywords)
    print(header(args.steps, **keywords))
    # an option left at a default of None stays unset in the children too
    forwarded = [item for flag, value in own.items() if value is not None
                 for item in (flag, value)]
    rerun_with_threads(script, args.threads, "--child", "--steps", args.steps, *forwarded)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--shell"]:
        sys.exit(__doc__)
    print(shell_exports())
