"""python -m spmdnet.bench: the models (alpha-beta fit, T(N) decomposition)
in process, and every subcommand at 1 and 2 ranks with tiny sizes."""
import json
import subprocess
import sys

import numpy as np
import pytest
from tests.helpers.launch import ROOT, mpiexec, run_mpi

from spmdnet import launch, profiler as timers
from spmdnet.bench import alphabeta, allreduce_bench, project, report, scaling, step_bench

PNG = b"\x89PNG\r\n\x1a\n"
HAVE_MPL = report.pyplot() is not None
TINY_MODEL = ("--hidden", "32", "--inputs", "16", "--classes", "4", "--steps", "4",
              "--warmup", "1")


def check_png(path):
    if not HAVE_MPL:
        pytest.skip("matplotlib is not installed: PNG not written")
    assert path.read_bytes()[:8] == PNG


def check_csv(path, columns, nrows):
    rows = report.read_csv(path)
    assert list(rows[0].keys()) == list(columns)
    assert len(rows) == nrows
    return rows


# -- models ----------------------------------------------------------------------------
def test_alpha_beta_fit_recovers_known_parameters():
    alpha, beta = 5e-6, 1 / 4e9  # 5 us, 4 GB/s
    n = 4.0 * 2 ** np.arange(0, 27)
    exact = alpha + beta * n
    assert alphabeta.fit(n, exact) == pytest.approx((alpha, beta), rel=1e-9)
    noisy = exact * np.random.default_rng(0).uniform(0.97, 1.03, len(n))
    a, b = alphabeta.fit(n, noisy)
    assert a == pytest.approx(alpha, rel=0.05) and b == pytest.approx(beta, rel=0.05)
    assert alphabeta.half_peak_bytes(alpha, beta) == pytest.approx(20000)
    measured = alphabeta.measured_half_peak_bytes(n, n / exact)
    assert measured == pytest.approx(20000, rel=0.1)


def test_alpha_beta_fit_needs_two_sizes():
    with pytest.raises(ValueError, match="two message sizes"):
        alphabeta.fit([1024, 1024], [1e-5, 1e-5])


def test_ring_model_and_its_inverse():
    a, b, n = 2e-6, 1 / 25e9, 100e6
    assert alphabeta.ring_allreduce_s(n, 1, a, b) == 0.0
    t8 = alphabeta.ring_allreduce_s(n, 8, a, b)
    assert t8 == pytest.approx(14 * a + 1.75 * n * b)
    fit_alpha, fit_beta = 14 * a, 1.75 * b  # what a fit over 8 ranks would find
    assert alphabeta.link_from_collective(fit_alpha, fit_beta, 8) == pytest.approx((a, b))
    parts = alphabeta.project_step(8, 0.8, 0.1, n, a, b, exposed=0.5)
    assert parts["step_s"] == pytest.approx(0.1 + 0.1 + 0.5 * t8)


def test_projection_parts_sum_and_scale_as_the_model_says():
    a, b, grad = 5e-6, 1 / 25e9, 8e6
    rows = project.project(1.0, 0.1, grad, [1, 4], a, b, exposed=1.0, batch=256)
    strong1, strong4, weak1, weak4 = rows
    for r in rows:
        assert r["parallel_s"] + r["sequential_s"] + r["communication_s"] == \
            pytest.approx(r["step_s"])
    ring = alphabeta.ring_allreduce_s(grad, 4, a, b)
    assert strong4["step_s"] == pytest.approx(0.25 + 0.1 + ring)
    assert strong4["speedup"] == pytest.approx(1.1 / strong4["step_s"])
    assert weak4["step_s"] == pytest.approx(1.1 + ring) and weak4["global_batch"] == 1024
    assert weak4["efficiency"] == pytest.approx(1.1 / (1.1 + ring))
    assert strong1["efficiency"] == weak1["efficiency"] == 1.0


def test_project_subcommand_says_it_is_a_projection(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spmdnet.bench", "project", "--ranks", "1",
                           "8", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("PROJECTION, not a measurement")
    check_csv(tmp_path / "projection.csv", project.COLUMNS, 4)
    check_png(tmp_path / "projection.png")


def test_decomposition_sums_to_the_step():
    rng = np.random.default_rng(1)
    phases = dict(zip(timers.PHASES, rng.uniform(0, 1, len(timers.PHASES))))
    parts = timers.decompose(phases)
    total = sum(phases.values())
    assert parts["step_s"] == pytest.approx(total)
    assert sum(parts[k] for k in scaling.PARTS) == pytest.approx(total)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_step_profiler_splits_exposed_communication_off_backward(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timers.time, "perf_counter", clock)

    class DDP:
        steps, last_exposed_comm_s = 0, 0.0

    class Loader:
        wait_s = 0.0

    ddp, loader = DDP(), Loader()
    prof = timers.StepProfiler(ddp, loader, warmup=1)
    for _ in range(5):
        loader.wait_s += 0.5  # the loop waited for this batch
        prof.begin()
        clock.now += 1.0
        prof.mark("forward")
        clock.now += 3.0  # backward 2.0 of compute, then 1.0 waiting for the allreduce
        ddp.steps, ddp.last_exposed_comm_s = ddp.steps + 1, 1.0
        prof.mark("backward")
        clock.now += 0.25
        prof.mark("optimizer")
        clock.now += 0.125
        prof.end()
    s = prof.summary()
    assert s["steps"] == 4
    assert {p: s[p] for p in timers.PHASES} == {"data": 0.5, "forward": 1.0, "backward": 2.0,
                                              "comm": 1.0, "optimizer": 0.25, "other": 0.125}
    assert s["step"] == pytest.approx(4.875)
    off = timers.StepProfiler(ddp, loader, enabled=False)
    off.begin(), off.mark("forward"), off.end()
    assert off.rows == [] and off.gather() is None


def test_step_profiler_rejects_unknown_phase():
    prof = timers.StepProfiler()
    with pytest.raises(RuntimeError, match="begin"):
        prof.mark("forward")
    prof.begin()
    with pytest.raises(ValueError, match="forwrd"):
        prof.mark("forwrd")


def test_interquartile_mean_drops_outliers_and_stays_additive():
    rows = np.ones((8, len(timers.PHASES)))
    rows[0] *= 100  # a step hit by noise
    rows[1] *= 0.01
    phases = timers.interquartile_mean(rows)
    assert all(v == pytest.approx(1.0) for v in phases.values())
    b = timers.Breakdown([dict(phases, step=6.0, steps=8),
                          dict(phases, forward=2.0, step=7.0, steps=8)])
    assert b.imbalance()["forward"] == 2.0 and b.imbalance()["data"] == 1.0
    assert b.parts()["step_s"] == pytest.approx(6.5)


def record(exp, ranks, step, par, seq, comm, ceiling=None, gb=256):
    return {"experiment": exp, "ranks": ranks, "step_s": step, "parallel_s": par,
            "sequential_s": seq, "communication_s": comm, "ceiling_s": ceiling,
            "global_batch": gb}


def test_scaling_analysis_speedup_efficiency_and_parts():
    runs = [record("strong", 1, 1.0, 0.9, 0.1, 0.0, 0.95),
            record("strong", 2, 0.62, 0.45, 0.1, 0.07, 0.5),
            record("strong", 2, 0.9, 0.6, 0.1, 0.2, 0.5),  # slower repeat
            record("strong", 2, 0.6, 0.45, 0.1, 0.05, 0.5),
            record("weak", 1, 1.0, 0.9, 0.1, 0.0, gb=256),
            record("weak", 4, 1.25, 1.0, 0.1, 0.15, gb=1024)]
    rows = scaling.analyse(runs)
    assert [(r["experiment"], r["ranks"], r["runs"]) for r in rows] == \
        [("strong", 1, 1), ("strong", 2, 3), ("weak", 1, 1), ("weak", 4, 1)]
    strong2, weak4 = rows[1], rows[3]
    assert strong2["step_s"] == 0.62  # the median run, whole
    for r in rows:
        assert sum(r[k] for k in scaling.PARTS) == pytest.approx(r["step_s"])
    assert strong2["speedup"] == pytest.approx(1 / 0.62)
    assert strong2["efficiency"] == pytest.approx(1 / 0.62 / 2)
    assert strong2["ideal_s"] == pytest.approx(0.5)
    assert strong2["parallel_slowdown"] == pytest.approx(0.45 / 0.45)
    assert strong2["ceiling_speedup"] == pytest.approx(0.95 / 0.5)
    assert weak4["efficiency"] == pytest.approx(0.8) and weak4["speedup"] == pytest.approx(3.2)
    assert weak4["parallel_slowdown"] == pytest.approx(1.0 / 0.9)
    assert "strong scaling" in scaling.table(rows)
    assert scaling.analyse(runs, pick="min")[1]["step_s"] == 0.6


def test_scaling_rejects_bad_run_records(tmp_path):
    bad = tmp_path / "a.json"
    bad.write_text(json.dumps({"experiment": "strong", "ranks": 2, "step_s": 1.0}))
    with pytest.raises(ValueError, match="parallel_s"):
        scaling.load_run(bad)
    bad.write_text(json.dumps(record("strong", 2, 1.0, 0.5, 0.1, 0.1)))
    with pytest.raises(ValueError, match="sum to"):
        scaling.load_run(bad)
    bad.write_text(json.dumps(record("sideways", 2, 1.0, 0.8, 0.1, 0.1)))
    with pytest.raises(ValueError, match="experiment"):
        scaling.load_run(bad)


def test_without_matplotlib_the_csv_is_written_and_the_png_skipped(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    notes = []
    assert report.write_png(tmp_path / "x.png", lambda fig: None, log=notes.append) is None
    assert len(notes) == 1 and "spmdnet[bench]" in notes[0]
    report.write_csv(tmp_path / "x.csv", ("a", "b"), [{"a": 1, "b": 0.5}])
    assert report.read_csv(tmp_path / "x.csv") == [{"a": "1", "b": "0.5"}]


# -- launching -------------------------------------------------------------------------
def test_job_env_sets_one_thread_per_rank_and_drops_the_outer_launcher():
    outer = {"PMI_RANK": "3", "HYDRA_CONTROL_FD": "9", "OMPI_COMM_WORLD_SIZE": "4",
             "OMP_NUM_THREADS": "8", "HOME": "/home/me"}
    env = launch.job_env(outer, SPMDNET_X="1")
    assert env == {"HOME": "/home/me", "SPMDNET_X": "1", "PYTHONUNBUFFERED": "1",
                   **dict.fromkeys(launch.THREAD_VARS, "1")}
    assert launch.command(3, "-m", "x", 7, prefix=["mpx"]) == \
        ["mpx", "-n", "3", sys.executable, "-m", "x", "7"]


def test_shell_exports_name_the_same_mpiexec(monkeypatch):
    monkeypatch.setattr(launch, "mpiexec", lambda: "/opt/my mpi/bin/mpiexec")
    line = launch.shell_exports()
    assert line.startswith("export OMP_NUM_THREADS=1 ")
    assert line.endswith(" MPIEXEC='/opt/my mpi/bin/mpiexec'")


# -- the subcommands under MPI ---------------------------------------------------------
def bench(n, *args):
    code, out, err, _ = run_mpi(n, "-m", "spmdnet.bench", *args, timeout=120)
    assert code == 0, out + err
    return out


@pytest.mark.parametrize("n", [1, 2])
def test_allreduce_subcommand(n, tmp_path):
    out = bench(n, "allreduce", "--max-bytes", "1K", "--reps", "3", "--out", tmp_path)
    sizes = allreduce_bench.message_sizes(4, 1024)
    groups = 1 if n == 1 else 2  # the world, and pairs from a Mesh split
    rows = check_csv(tmp_path / "allreduce.csv", allreduce_bench.COLUMNS, groups * 2 * len(sizes))
    assert {r["group"] for r in rows} == ({"world"} if n == 1 else {"world", "pairs"})
    assert all(float(r["time_s"]) > 0 for r in rows)
    fits = check_csv(tmp_path / "allreduce_fit.csv", allreduce_bench.FIT_COLUMNS, groups * 2)
    assert all(np.isfinite(float(f["alpha_s"])) for f in fits)
    assert "alpha" in out and "n_1/2" in out
    check_png(tmp_path / "allreduce.png")


@pytest.mark.parametrize("n", [1, 2])
def test_step_subcommand(n, tmp_path):
    out = bench(n, "step", *TINY_MODEL, "--global-batch", "16", "--ceiling", "--out", tmp_path,
                "--json", tmp_path / "run.json", "--experiment", "strong")
    rows = check_csv(tmp_path / "step.csv", step_bench.COLUMNS, n + 2)
    assert [r["rank"] for r in rows] == [str(r) for r in range(n)] + ["mean", "max/min"]
    for r in rows[:-1]:
        phases = sum(float(r[f"{p}_s"]) for p in timers.PHASES)
        assert phases == pytest.approx(float(r["step_s"]), rel=1e-4)
    run = scaling.load_run(tmp_path / "run.json")  # validates that the parts sum
    assert run["ranks"] == n and run["local_batch"] == 16 // n and run["ceiling_s"] > 0
    assert "T(N) = parallel" in out
    check_png(tmp_path / "step.png")


@pytest.fixture(scope="module")
def scaling_runs(tmp_path_factory):
    """`bench scaling --ranks 1 2` launched from a 1-rank MPI job (the nested
    launch must not inherit the outer job's environment). Strong and weak
    share their 1-rank point (same per-rank batch): three runs."""
    out = tmp_path_factory.mktemp("scaling")
    log = bench(1, "scaling", "--ranks", "1", "2", "--repeat", "1", *TINY_MODEL,
                "--global-batch", "16", "--local-batch", "16", "--out", out)
    return out, log


def check_scaling_csv(path):
    rows = check_csv(path, scaling.COLUMNS, 4)
    assert [(r["experiment"], r["ranks"]) for r in rows] == \
        [("strong", "1"), ("strong", "2"), ("weak", "1"), ("weak", "2")]
    for r in rows:
        parts = sum(float(r[k]) for k in scaling.PARTS)
        assert parts == pytest.approx(float(r["step_s"]), rel=1e-4)
    assert float(rows[0]["speedup"]) == 1.0 and float(rows[2]["efficiency"]) == 1.0
    return rows


def test_scaling_subcommand_launches_its_runs(scaling_runs):
    out, log = scaling_runs
    assert "strong scaling" in log and "weak scaling" in log
    assert len(list((out / "runs").glob("*.json"))) == 4
    check_scaling_csv(out / "scaling.csv")
    check_png(out / "scaling.png")


def test_scaling_from_run_records_on_two_ranks(scaling_runs, tmp_path):
    runs = scaling_runs[0] / "runs"
    bench(2, "scaling", "--from", runs, "--out", tmp_path)
    check_scaling_csv(tmp_path / "scaling.csv")
    check_png(tmp_path / "scaling.png")


def test_scaling_refuses_to_launch_from_a_multi_rank_job(tmp_path):
    code, out, err, _ = run_mpi(2, "-m", "spmdnet.bench", "scaling", "--out", tmp_path)
    assert code != 0 and "start it as one process" in err


def test_help_says_how_to_get_plots():
    proc = subprocess.run([sys.executable, "-m", "spmdnet.bench", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "spmdnet[bench]" in proc.stdout
    assert mpiexec()  # the MPI tests above need one


SWEEP = '''
"""A benchmark with its own option."""
from spmdnet.launch import thread_sweep


def child(steps, width, limit):
    import os
    print(f"child threads={os.environ['OMP_NUM_THREADS']} steps={steps} width={width} "
          f"limit={limit}")


def header(steps, width, limit):
    return f"header steps={steps} width={width} limit={limit}"


thread_sweep(__file__, __doc__, child, header, steps=4,
             options={"--width": (int, 64, "channels"), "--limit": (int, None, "a cap")})
'''


def test_thread_sweep_forwards_a_benchmarks_own_option(tmp_path):
    """benchmarks/resnet18_full_step.py --width: the option reaches the
    header and every child process, with the thread count of each; one left
    at a default of None stays None there."""
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP)
    out = subprocess.run([sys.executable, str(script), "--width", "8", "--threads", "1", "2",
                          "--limit", "3"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT, check=True).stdout
    assert out.splitlines() == ["header steps=4 width=8 limit=3",
                                "child threads=1 steps=4 width=8 limit=3",
                                "child threads=2 steps=4 width=8 limit=3"]
    default = subprocess.run([sys.executable, str(script), "--steps", "2"], capture_output=True,
                             text=True, timeout=60, cwd=ROOT, check=True).stdout
    assert default.splitlines() == ["header steps=2 width=64 limit=None",
                                    "child threads=1 steps=2 width=64 limit=None"]
