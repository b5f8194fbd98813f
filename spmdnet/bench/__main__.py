"""python -m spmdnet.bench {allreduce,step,scaling,project} [options]

Scaling studies of spmdnet on this machine or cluster. Every subcommand
writes a CSV and a PNG into --out DIR. Launch `allreduce` and `step` like
any MPI program:

    mpirun -n 2 python -m spmdnet.bench allreduce --max-bytes 64M
    mpirun -n 2 python -m spmdnet.bench step --global-batch 256 --ceiling
    srun -n 8 python -m spmdnet.bench step --json runs/strong_n8.json --experiment strong

`scaling` is started as one plain process: it launches `-n N` runs itself
(srun inside a Slurm job, else mpiexec), or reads finished run records:

    python -m spmdnet.bench scaling --ranks 1 2 4 8
    python -m spmdnet.bench scaling --from runs/

`project` is a model, not a measurement: scaling over many GPUs from the
alpha-beta model of a ring allreduce, with the interconnect figures as inputs:

    python -m spmdnet.bench project --bandwidth-gbps 25 --latency-us 5

PNG plots need matplotlib: pip install 'spmdnet[bench]'. Without it the
CSV is still written and one line says the PNG was skipped. Run one BLAS
thread per rank (export OMP_NUM_THREADS=1) unless you measure threading.
"""
import argparse
import sys

from . import allreduce_bench, project, scaling, step_bench
from .report import INSTALL_HINT

RUN = {"allreduce": allreduce_bench.run, "step": step_bench.run, "scaling": scaling.run,
       "project": project.run}
PROJECT_INPUTS = (  # `project`'s figures: option, default, help
    ("--tflops", 10.0, "sustained TFLOP/s of one GPU on this model (default 10)"),
    ("--t-seq-ms", 0.5, "per-step time that does not shrink with N, ms (default 0.5)"),
    ("--bandwidth-gbps", 25.0, "link bandwidth, GB/s (default 25: 200 Gb/s InfiniBand HDR)"),
    ("--latency-us", 5.0, "link latency incl. software, us (default 5)"),
    ("--exposed", 1.0, "fraction of the allreduce not hidden behind backward (default 1)"),
)


def parse_bytes(text):
    """'4', '4K', '1M', '256M', '1G' (powers of 1024) -> bytes."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper().removesuffix("B")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (e.g. 4096, 64K, "
                                         "256M)") from None


def add_model_args(p):
    inputs, *hidden, classes = step_bench.LAYERS
    p.add_argument("--hidden", type=int, nargs="+", default=hidden,
                   help=f"hidden layer widths (default: {' '.join(map(str, hidden))})")
    p.add_argument("--inputs", type=int, default=inputs)
    p.add_argument("--classes", type=int, default=classes)
    p.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed first steps (default 5)")
    p.add_argument("--overlap", default="auto",
                   choices=["auto", "nonblocking", "thread", "none"],
                   help="DataParallel's overlap mode")


def parser():
    p = argparse.ArgumentParser(
        prog="python -m spmdnet.bench", description=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", default="bench-results", help="output directory "
                        "(default: bench-results)")
    common.add_argument("--no-png", action="store_true", help="write only the CSV")
    sub = p.add_subparsers(dest="command", required=True)

    hint = f"PNG plots need matplotlib: {INSTALL_HINT}"
    a = sub.add_parser("allreduce", parents=[common], epilog=hint,
                       help="latency, bus bandwidth and alpha-beta fit of allreduce on the "
                       "world and split communicators")
    a.add_argument("--min-bytes", type=parse_bytes, default=4)
    a.add_argument("--max-bytes", type=parse_bytes, default=256 * 2**20,
                   help="largest message (default 256M)")
    a.add_argument("--factor", type=int, default=4, help="size ratio between messages")
    a.add_argument("--reps", type=int, default=30, help="repetitions of small messages "
                   "(fewer from 4 MB up, at least 3)")

    s = sub.add_parser("step", parents=[common], epilog=hint,
                       help="per-rank breakdown of one training step")
    batch = s.add_mutually_exclusive_group()
    batch.add_argument("--global-batch", type=int, default=256,
                       help="samples per step over all ranks (default 256; strong scaling)")
    batch.add_argument("--local-batch", type=int, help="samples per rank (weak scaling)")
    add_model_args(s)
    s.add_argument("--bucket-mb", type=float, default=25.0)
    s.add_argument("--ceiling", action="store_true",
                   help="also time the same steps without communication, interleaved")
    s.add_argument("--json", help="write the run record for `scaling --from` here")
    s.add_argument("--experiment", choices=["strong", "weak"],
                   help="label of the run record (for `scaling --from`)")

    c = sub.add_parser("scaling", parents=[common], epilog=hint,
                       help="strong and weak scaling over rank counts; start as one process")
    c.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    c.add_argument("--experiments", nargs="+", choices=["strong", "weak"],
                   default=["strong", "weak"])
    c.add_argument("--global-batch", type=int, default=256, help="strong scaling's batch")
    c.add_argument("--local-batch", type=int, default=256, help="weak scaling's batch per rank")
    add_model_args(c)
    c.add_argument("--repeat", type=int, default=3,
                   help="runs per point, interleaved (default 3)")
    c.add_argument("--pick", choices=["median", "min"], default="median",
                   help="which run of a point is reported: the median, or the fastest "
                   "(on a shared machine noise only adds time)")
    c.add_argument("--launcher", help="launch command before '-n N' (default: srun in a "
                   "Slurm job, else mpiexec)")
    c.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    c.add_argument("--from", dest="from_dir", metavar="DIR",
                   help="analyse run records (*.json) in DIR instead of launching")

    j = sub.add_parser("project", parents=[common], epilog=hint,
                       help="PROJECTION (alpha-beta model, not a measurement) of scaling "
                       "over many GPUs from stated interconnect figures")
    j.add_argument("--layers", type=int, nargs="+", default=list(step_bench.LAYERS),
                   help="MLP layer widths (parameters, FLOPs and gradient bytes)")
    j.add_argument("--global-batch", type=int, default=256,
                   help="strong scaling's batch; weak scaling's batch per rank")
    for flag, default, text in PROJECT_INPUTS:
        j.add_argument(flag, type=float, default=default, help=text)
    j.add_argument("--from-run", help="take T_par and T_seq from a 1-rank `bench step "
                   "--json` record instead")
    j.add_argument("--ranks", type=int, nargs="+",
                   default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    return RUN[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
