"""``python -m spmdnet.distributed.run --nproc-per-node N script.py args`` (also
``python -m spmdnet.run``): torchrun's command line, started under MPI.

torchrun's common flags are accepted (both ``--nproc-per-node`` and
``--nproc_per_node`` spellings); the job is ``mpiexec -n N python script.py
args`` (the launcher rule of ``spmdnet.launch``), each rank under a small
supervisor (``multiprocessing/lifeline.py``) that notes how it ended. This
process forwards SIGINT/SIGTERM/SIGUSR1/SIGUSR2/SIGHUP to mpiexec and exits
with its status; as torchrun, it ends the whole job as soon as one rank
fails (a nonzero exit code or a signal), also before MPI started, where
mpiexec alone would wait for that rank for ever: the rank's traceback is
on stderr, followed by a line naming the rank, and the command exits with
the rank's exit code (128 + N for signal N). If this process dies, the ranks
end too.
Each rank sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE`` when it imports spmdnet. One node: across nodes, start
the job with ``srun`` or ``mpiexec`` directly (the rendezvous flags are
accepted and unused, MPI's launcher is the rendezvous).
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .. import launch
from ..multiprocessing import lifeline

GRACE_S = 1.0  # after a rank fails, how long the others may take to report theirs
SIGNAL_GRACE_S = 30.0  # after a forwarded signal: the ranks stop at their own pace

_UNUSED = ("rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "master-addr",
           "master-port", "local-addr", "role", "log-dir", "redirects", "tee",
           "monitor-interval", "start-method", "logs-specs", "local-ranks-filter")


def _flag(parser, name, **kwargs):
    """Add ``--name`` with torchrun's underscore spelling as an alias."""
    spellings = [f"--{name}"]
    if "-" in name:
        spellings.append(f"--{name.replace('-', '_')}")
    parser.add_argument(*spellings, **kwargs)


def parser():
    p = argparse.ArgumentParser(prog="python -m spmdnet.run",
                                description=__doc__.split("\n\n")[0])
    _flag(p, "nproc-per-node", default="1",
          help="ranks to start: a number, or auto/gpu (one per GPU, else one per CPU)/cpu")
    _flag(p, "nnodes", default="1", help="must be 1 (use srun/mpiexec across nodes)")
    _flag(p, "node-rank", type=int, default=0)
    _flag(p, "max-restarts", type=int, default=0, help="must be 0")
    p.add_argument("--standalone", action="store_true")
    for name in _UNUSED:
        _flag(p, name, default=None, help=argparse.SUPPRESS)
    p.add_argument("-m", "--module", action="store_true",
                   help="run the script as a module (python -m)")
    _flag(p, "no-python", action="store_true", help="run the script as a program, not Python")
    _flag(p, "run-path", action="store_true", help="(the default here)")
    p.add_argument("script", help="the training script (or module, with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p


def nproc(value):
    """The number of ranks for ``--nproc-per-node``."""
    if str(value).isdigit() and int(value) > 0:
        return int(value)
    if value in ("auto", "gpu"):
        from .backend import cupy_available, gpu_count  # noqa: PLC0415 - only when asked
        if cupy_available():
            return gpu_count()
        if value == "gpu":
            raise SystemExit("spmdnet.run: --nproc-per-node gpu, but CuPy sees no GPU")
    if value in ("auto", "cpu"):
        return os.cpu_count() or 1
    raise SystemExit(f"spmdnet.run: --nproc-per-node {value!r}: expected a positive number, "
                     "auto, gpu or cpu")


def command(args, folder=None):
    """The argv of the MPI job for parsed ``args`` (with ``folder``: each rank
    under the supervisor that notes its status there)."""
    nodes = str(args.nnodes)
    if nodes.split(":")[-1] != "1":
        raise SystemExit(f"spmdnet.run: --nnodes {nodes}: one node only; across nodes, start "
                         "the script with srun or mpiexec (each rank finds its rank there)")
    if args.max_restarts:
        raise SystemExit(f"spmdnet.run: --max-restarts {args.max_restarts}: restarts are not "
                         "supported; resume from a checkpoint instead")
    program = [args.script] if args.no_python else \
        [sys.executable, *(["-m"] if args.module else []), args.script]
    supervisor = [] if folder is None else \
        [sys.executable, lifeline.__file__, folder, str(os.getpid())]
    return [*launch.launcher(), "-n", str(nproc(args.nproc_per_node)), *supervisor,
            *program, *args.script_args]


def _first_failure(folder):
    """(rank, ("exit", code) or ("signal", n)) of the first rank that failed, or None."""
    failed = [(os.path.getmtime(os.path.join(folder, f"status-{r}")), r, st)
              for r, st in lifeline.read_statuses(folder).items() if st != ("exit", 0)]
    return min(failed)[1:] if failed else None


def _end(proc):
    proc.terminate()  # mpiexec passes SIGTERM on to the ranks
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def supervise(proc, folder, signalled=lambda: False):
    """Wait for the job; end it when a rank fails (``signalled()``: whether a
    signal was forwarded, which gives the ranks longer to stop). Returns the
    exit status."""
    failed_at = None
    while proc.poll() is None:
        if failed_at is None and _first_failure(folder):
            failed_at = time.monotonic()
        grace = SIGNAL_GRACE_S if signalled() else GRACE_S
        if failed_at is not None and time.monotonic() - failed_at > grace:
            _end(proc)
            break
        time.sleep(0.05)
    else:  # the job ended by itself (every rank stopping with code 3, say): its status
        return proc.wait()
    failure = _first_failure(folder)
    rank, (kind, value) = failure
    what = (f"signal {signal.Signals(value).name}" if kind == "signal" and
            value in signal.Signals._value2member_map_ else f"{kind} code {value}")
    print(f"spmdnet.run: rank {rank} failed ({what}); "
          "the other ranks were ended", file=sys.stderr, flush=True)
    return 128 + value if kind == "signal" else value


def main(argv=None):
    args = parser().parse_args(argv)
    env = launch.job_env()
    for name in ("master_addr", "master_port"):
        if getattr(args, name) is not None:
            env[name.upper()] = str(getattr(args, name))
    folder = tempfile.mkdtemp(prefix="spmdnet-run-")
    try:
        proc = subprocess.Popen(command(args, folder), env=env)

        received = []

        def forward(signum, frame):
            received.append(signum)
            if proc.poll() is None:
                proc.send_signal(signum)

        for name in lifeline.FORWARDED:
            signal.signal(getattr(signal, name), forward)
        return supervise(proc, folder, lambda: bool(received))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        launch.clean_topology_files()


if __name__ == "__main__":
    sys.exit(main())
