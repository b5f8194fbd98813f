"""``bench scaling``: strong and weak scaling of the training step.

Strong scaling keeps the global batch fixed (more ranks, less work each:
speedup = T(N0)/T(N), ideal N/N0); weak scaling keeps the per-rank batch
fixed (the problem grows with the ranks: efficiency = T(N0)/T(N), ideal 1).
N0 is the smallest rank count measured. Each measured step time is split
into the parts of T(N) = T_par/N + T_seq + T_comm:
  parallel       data wait + forward + backward compute (work per sample,
                 divided among the ranks)
  sequential     optimizer + the rest (the same on every rank whatever N:
                 the parameters are replicated)
  communication  the exposed allreduce wait
which sum to the measured step. ``parallel_slowdown`` compares the
parallel part with its ideal (T_par(N0)*N0/N strong, T_par(N0) weak): above
1, the ranks slow each other down (shared memory bandwidth, oversubscribed
cores).

Runs are launched with ``-n N`` of ``spmdnet.launch.launcher`` (``srun``
inside a Slurm job, else the ``mpiexec`` next to this Python, else on PATH;
one thread per rank), each a
``bench step --json`` run whose record is written to OUT/runs/; ``--from DIR``
reads such records instead (one JSON file per run, format in ``load_run``).
"""
import glob
import json
import os
import shlex
import sys
import tempfile

import numpy as np

from .. import launch
from . import report

EXPERIMENTS = ("strong", "weak")
REQUIRED = ("experiment", "ranks", "step_s", "parallel_s", "sequential_s", "communication_s")
PARTS = ("parallel_s", "sequential_s", "communication_s")
COLUMNS = ("experiment", "ranks", "global_batch", "local_batch", "step_s", "parallel_s",
           "sequential_s", "communication_s", "ideal_s", "speedup", "efficiency",
           "parallel_slowdown", "ceiling_s", "ceiling_speedup", "samples_per_s", "runs")


# -- reading runs ----------------------------------------------------------------------
def load_run(path):
    """One run record (JSON object). Required keys: ``experiment`` ("strong"
    or "weak"), ``ranks``, ``step_s`` and its parts ``parallel_s``,
    ``sequential_s``, ``communication_s`` (seconds, summing to ``step_s``).
    Optional: ``global_batch``, ``local_batch``, ``ceiling_s`` (the
    no-communication step), anything else (kept, unused)."""
    with open(path) as f:
        run = json.load(f)
    missing = [k for k in REQUIRED if run.get(k) is None]
    if missing:
        raise ValueError(f"{path}: missing {missing} (a run record needs {list(REQUIRED)}; "
                         f"write it with `python -m spmdnet.bench step --json {path} "
                         f"--experiment strong|weak`)")
    if run["experiment"] not in EXPERIMENTS:
        raise ValueError(f"{path}: experiment must be one of {EXPERIMENTS}, "
                         f"got {run['experiment']!r}")
    total = sum(run[k] for k in PARTS)
    if abs(total - run["step_s"]) > 1e-6 * run["step_s"] + 1e-9:
        raise ValueError(f"{path}: parts {[run[k] for k in PARTS]} sum to {total}, "
                         f"not to step_s {run['step_s']}")
    run["path"] = str(path)
    return run


def load_runs(directory):
    paths = sorted(glob.glob(os.path.join(directory, "*.json")))
    if not paths:
        raise ValueError(f"no run records (*.json) in {directory}")
    return [load_run(p) for p in paths]


# -- analysis --------------------------------------------------------------------------
def pick_run(runs, pick="median"):
    """The run with the median (the lower one for an even count) or the
    minimum step time, whole: its parts still sum to the reported time.
    "min" suits a shared machine, where noise only ever adds time."""
    ordered = sorted(runs, key=lambda r: r["step_s"])
    return ordered[(len(ordered) - 1) // 2 if pick == "median" else 0]


def analyse(runs, pick="median"):
    """Rows of COLUMNS, one per (experiment, ranks), from run records."""
    rows = []
    for exp in EXPERIMENTS:
        by_n = {}
        for r in runs:
            if r["experiment"] == exp:
                by_n.setdefault(int(r["ranks"]), []).append(r)
        if not by_n:
            continue
        n0 = min(by_n)
        base = pick_run(by_n[n0], pick)
        for n in sorted(by_n):
            rows.append(scaling_row(exp, n, n0, pick_run(by_n[n], pick), base, len(by_n[n])))
    return rows


def scaling_row(exp, n, n0, run, base, count):
    t, t0 = run["step_s"], base["step_s"]
    share = n0 / n if exp == "strong" else 1.0  # ideal fraction of the base's work per rank
    row = {"experiment": exp, "ranks": n, "global_batch": run.get("global_batch", ""),
           "local_batch": run.get("local_batch", ""), "step_s": t,
           **{k: run[k] for k in PARTS}, "ideal_s": t0 * share, "runs": count,
           "efficiency": t0 * share / t, "speedup": t0 * share / t * n / n0,
           "parallel_slowdown": run["parallel_s"] / (base["parallel_s"] * share)
           if base["parallel_s"] > 0 else np.nan}
    c, c0 = run.get("ceiling_s"), base.get("ceiling_s")
    row["ceiling_s"] = c if c is not None else ""
    row["ceiling_speedup"] = c0 * share / c * n / n0 if c and c0 else ""
    gb = run.get("global_batch")
    row["samples_per_s"] = gb / t if gb else ""
    return row


def table(rows):
    """The rows as text, milliseconds."""
    head = (f"{'ranks':>5} {'step':>8} {'ideal':>8} {'parallel':>9} {'sequential':>10} "
            f"{'comm':>7} {'speedup':>8} {'effic.':>7} {'par.slow':>8} {'ceiling':>8} "
            f"{'ceil.spd':>8}")
    lines = []
    for exp in EXPERIMENTS:
        sel = [r for r in rows if r["experiment"] == exp]
        if not sel:
            continue
        fixed = (f"global batch {sel[0]['global_batch']}" if exp == "strong"
                 else f"{sel[0]['local_batch']} per rank")
        lines += [f"{exp} scaling ({fixed}), ms per step = parallel + sequential + comm", head]
        for r in sel:
            ceil = [f"{1e3 * r['ceiling_s']:8.2f}" if r["ceiling_s"] != "" else "",
                    f"{r['ceiling_speedup']:8.2f}" if r["ceiling_speedup"] != "" else ""]
            lines.append(f"{r['ranks']:>5} {1e3 * r['step_s']:8.2f} {1e3 * r['ideal_s']:8.2f} "
                         f"{1e3 * r['parallel_s']:9.2f} {1e3 * r['sequential_s']:10.2f} "
                         f"{1e3 * r['communication_s']:7.2f} {r['speedup']:8.2f} "
                         f"{r['efficiency']:7.2f} {r['parallel_slowdown']:8.2f} "
                         f"{ceil[0]:>8} {ceil[1]:>8}")
    return "\n".join(lines)


def draw(rows):
    exps = [e for e in EXPERIMENTS if any(r["experiment"] == e for r in rows)]

    def plot(fig):
        axes = fig.subplots(2, len(exps), squeeze=False)
        for col, exp in enumerate(exps):
            sel = [r for r in rows if r["experiment"] == exp]
            n = np.array([r["ranks"] for r in sel])
            top, bottom = axes[0][col], axes[1][col]
            if exp == "strong":
                top.plot(n, [r["speedup"] for r in sel], "o-", label="measured")
                top.plot(n, n / n[0], "k--", label="ideal")
                if all(r["ceiling_speedup"] != "" for r in sel):
                    top.plot(n, [r["ceiling_speedup"] for r in sel], "s:",
                             label="no-comm ceiling")
                top.set(ylabel="speedup", title="strong scaling (fixed global batch)")
            else:
                top.plot(n, [r["efficiency"] for r in sel], "o-", label="measured")
                top.plot(n, np.ones(len(n)), "k--", label="ideal")
                if all(r["ceiling_speedup"] != "" for r in sel):
                    top.plot(n, [r["ceiling_speedup"] * n[0] / r["ranks"] for r in sel], "s:",
                             label="no-comm ceiling")
                top.set(ylabel="efficiency", ylim=(0, 1.1),
                        title="weak scaling (fixed batch per rank)")
            top.set_xscale("log", base=2)
            top.set_xticks(n, [str(v) for v in n])
            top.legend(fontsize=7)
            x = np.arange(len(sel))
            below = np.zeros(len(sel))
            for part, color in zip(PARTS, ("tab:blue", "tab:orange", "tab:red")):
                h = np.array([1e3 * r[part] for r in sel])
                bottom.bar(x, h, bottom=below, label=part[:-2], color=color)
                below += h
            bottom.plot(x, [1e3 * r["ideal_s"] for r in sel], "k_", ms=30, mew=2, label="ideal")
            bottom.set_xticks(x, [str(v) for v in n])
            bottom.set(xlabel="ranks", ylabel="ms per step", title="T(N) decomposed")
            bottom.legend(fontsize=7)
    return plot


# -- launching -------------------------------------------------------------------------
def step_args(args, exp):
    batch = (["--global-batch", str(args.global_batch)] if exp == "strong"
             else ["--local-batch", str(args.local_batch)])
    return [*batch, "--hidden", *map(str, args.hidden), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--overlap", args.overlap, "--ceiling",
            "--experiment", exp]


def launch_runs(args, runs_dir, log=print):
    """Every (repeat, experiment, N) run, interleaved so that slow spells of
    the machine spread over all of them; returns the JSON paths written.
    A strong and a weak point with the same ranks and per-rank batch (the
    base point, usually) are one run, recorded under both names."""
    bad = [n for n in args.ranks if "strong" in args.experiments and args.global_batch % n]
    if bad:
        raise ValueError(f"--global-batch {args.global_batch} does not divide over {bad} ranks")
    launcher = shlex.split(args.launcher) if args.launcher else launch.launcher(srun=True)
    log(f"launcher: {' '.join(launcher)} -n N; runs in {runs_dir}")
    paths = []
    for rep in range(args.repeat):
        done = {}  # (ranks, per-rank batch) -> record of this repeat
        for exp in args.experiments:
            for n in args.ranks:
                name = f"{exp}_n{n}_r{rep}"
                path = os.path.join(runs_dir, name + ".json")
                key = (n, args.global_batch // n if exp == "strong" else args.local_batch)
                if key in done:
                    record = dict(done[key], experiment=exp)
                    with open(path, "w") as f:
                        json.dump({k: v for k, v in record.items() if k != "path"}, f, indent=1)
                else:
                    run_step(launcher, n, step_args(args, exp), path, args.timeout)
                done[key] = run = load_run(path)
                log(f"  {exp:>6} N={n} repeat {rep}: {1e3 * run['step_s']:.2f} ms per step")
                paths.append(path)
    return paths


def run_step(launcher, n, step_arguments, path, timeout):
    """One ``bench step --json path`` run on n ranks (its CSV is not kept)."""
    with tempfile.TemporaryDirectory() as out:
        args = ("-m", "spmdnet.bench", "step", "--no-png", *step_arguments, "--json", path,
                "--out", out)
        proc = launch.run(n, *args, prefix=launcher, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({proc.returncode}): "
                           f"{' '.join(launch.command(n, *args, prefix=launcher))}\n"
                           f"{proc.stderr[-3000:]}")


def run(args):
    if args.from_dir is None and launch.launched_size() > 1:
        if launch.launched_rank() == 0:
            print("bench scaling launches its own MPI runs: start it as one process "
                  "(under Slurm, from the batch script, not through srun), or analyse "
                  "finished runs with --from DIR", file=sys.stderr)
        return 2
    if launch.launched_rank() != 0:
        return 0  # --from under a launcher: rank 0 does the (serial) analysis
    if args.from_dir is None:
        runs_dir = os.path.join(args.out, "runs")
        os.makedirs(runs_dir, exist_ok=True)
        for stale in glob.glob(os.path.join(runs_dir, "*.json")):
            os.remove(stale)
        launch_runs(args, runs_dir)
    rows = analyse(load_runs(args.from_dir or os.path.join(args.out, "runs")), args.pick)
    print(table(rows))
    report.save(args, "scaling", COLUMNS, rows, draw(rows),
                figsize=(5 * len({r['experiment'] for r in rows}), 7))
    return 0
