"""``python -m spmdnet.run --nproc-per-node N script.py args``: torchrun's
command line, started under MPI.

torchrun's common flags are accepted (both ``--nproc-per-node`` and
``--nproc_per_node`` spellings); the job is ``mpiexec -n N python script.py
args`` (the launcher rule of ``spmdnet.launch``), which replaces this
process, so signals reach mpiexec and its exit status is the command's.
Each rank sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE`` when it imports spmdnet. One node: across nodes, start
the job with ``srun`` or ``mpiexec`` directly (the rendezvous flags are
accepted and unused, MPI's launcher is the rendezvous).
"""
import argparse
import os
import sys

from . import launch

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


def command(args):
    """The argv of the MPI job for parsed ``args``."""
    nodes = str(args.nnodes)
    if nodes.split(":")[-1] != "1":
        raise SystemExit(f"spmdnet.run: --nnodes {nodes}: one node only; across nodes, start "
                         "the script with srun or mpiexec (each rank finds its rank there)")
    if args.max_restarts:
        raise SystemExit(f"spmdnet.run: --max-restarts {args.max_restarts}: restarts are not "
                         "supported; resume from a checkpoint instead")
    program = [args.script] if args.no_python else \
        [sys.executable, *(["-m"] if args.module else []), args.script]
    return [*launch.launcher(), "-n", str(nproc(args.nproc_per_node)), *program,
            *args.script_args]


def main(argv=None):
    args = parser().parse_args(argv)
    argv = command(args)
    env = launch.job_env()
    for name in ("master_addr", "master_port"):
        if getattr(args, name) is not None:
            env[name.upper()] = str(getattr(args, name))
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    main()
