"""``bench project``: a PROJECTION (a model, not a measurement) of strong
and weak scaling over many ranks, from the alpha-beta model of a ring
allreduce and stated inputs:

  T(N) = T_par / N + T_seq + exposed * T_ring(N)          (strong)
  T(N) = T_par     + T_seq + exposed * T_ring(N)          (weak)
  T_ring(N) = 2(N-1) * alpha + 2(N-1)/N * gradient_bytes * beta

T_par comes from the model's FLOPs (6 x parameters x batch for an MLP's
forward and backward) at an assumed sustained rate, or from a measured run
record (``--from-run``, the JSON of ``bench step``); T_seq (per-step time
that does not shrink with N: Python overhead, the optimizer on replicated
parameters) is an input; alpha and beta are the interconnect's latency and
1/bandwidth per link. The ring is flat: every hop at the given link speed.
"""
import json
import textwrap

import numpy as np

from . import alphabeta, report

COLUMNS = ("experiment", "ranks", "global_batch", "step_s", "parallel_s", "sequential_s",
           "communication_s", "speedup", "efficiency")


def mlp_parameters(layers):
    return sum(i * o + o for i, o in zip(layers[:-1], layers[1:]))


def inputs(args):
    """(t_par at one rank, t_seq, gradient bytes, batch, source description)."""
    if args.from_run:
        with open(args.from_run) as f:
            run = json.load(f)
        if run.get("ranks") != 1:
            raise ValueError(f"{args.from_run}: --from-run needs a 1-rank record, got ranks "
                             f"{run.get('ranks')}")
        return (run["parallel_s"], run["sequential_s"], 4 * mlp_parameters(run["layers"]),
                run["global_batch"], f"measured 1-rank run {args.from_run}")
    params = mlp_parameters(args.layers)
    flops = 6 * params * args.global_batch
    return (flops / (args.tflops * 1e12), args.t_seq_ms * 1e-3, 4 * params, args.global_batch,
            f"MLP {'-'.join(map(str, args.layers))} ({params / 1e6:.2f} M parameters), "
            f"batch {args.global_batch}: {flops / 1e9:.2f} GFLOP per step at "
            f"{args.tflops} TFLOP/s")


def project(t_par, t_seq, grad_bytes, ranks, alpha, beta, exposed, batch):
    """Rows of COLUMNS: strong (fixed global ``batch``) and weak (``batch``
    per rank) scaling, relative to the smallest rank count."""
    rows = []
    for exp in ("strong", "weak"):
        base = None
        for n in ranks:
            parts = alphabeta.project_step(n, t_par, t_seq, grad_bytes, alpha, beta, exposed,
                                           weak=exp == "weak")
            base = base or (n, parts["step_s"])
            share = base[0] / n if exp == "strong" else 1.0
            eff = base[1] * share / parts["step_s"]
            rows.append({"experiment": exp, "ranks": n,
                         "global_batch": batch if exp == "strong" else batch * n,
                         **parts, "efficiency": eff, "speedup": eff * n / base[0]})
    return rows


def draw(rows, title):
    def plot(fig):
        a, b = fig.subplots(1, 2)
        for exp, ax in (("strong", a), ("weak", b)):
            sel = [r for r in rows if r["experiment"] == exp]
            n = np.array([r["ranks"] for r in sel])
            y = [r["speedup"] for r in sel]
            ax.loglog(n, y, "o-", base=2, label="projected")
            ax.loglog(n, n / n[0], "k--", base=2, label="ideal")
            ax.set_xticks(n, [str(v) for v in n])
            ax.set(xlabel="ranks (GPUs)", ylabel="speedup (throughput)",
                   title=f"{exp} scaling: PROJECTION")
            ax.legend(fontsize=7)
        fig.suptitle(textwrap.fill(title, 130), fontsize=8)
    return plot


def run(args):
    t_par, t_seq, grad_bytes, batch, source = inputs(args)
    alpha, beta = args.latency_us * 1e-6, 1 / (args.bandwidth_gbps * 1e9)
    rows = project(t_par, t_seq, grad_bytes, args.ranks, alpha, beta, args.exposed, batch)
    title = (f"PROJECTION, not a measurement: {source}; T_par(1) {t_par * 1e3:.3g} ms, "
             f"T_seq {t_seq * 1e3:.3g} ms; gradient {grad_bytes / 1e6:.1f} MB; link "
             f"{args.bandwidth_gbps} GB/s, {args.latency_us} us; exposed allreduce fraction "
             f"{args.exposed}")
    print(title)
    print(f"{'exp':>6} {'ranks':>6} {'step_ms':>9} {'par_ms':>8} {'seq_ms':>8} {'comm_ms':>8} "
          f"{'speedup':>8} {'effic.':>7}")
    for r in rows:
        print(f"{r['experiment']:>6} {r['ranks']:>6} {1e3 * r['step_s']:9.3f} "
              f"{1e3 * r['parallel_s']:8.3f} {1e3 * r['sequential_s']:8.3f} "
              f"{1e3 * r['communication_s']:8.3f} {r['speedup']:8.2f} {r['efficiency']:7.2f}")
    report.save(args, "projection", COLUMNS, rows, draw(rows, title), figsize=(9, 4.5))
    return 0
