"""examples/train_gpt.py in each mode, short: data parallel, --tp 2, --pp 2
and --fsdp train the same model (the same loss lines, up to rounding), and a
run stopped and resumed from its checkpoint prints the uninterrupted run's
loss lines; SIGTERM to one rank checkpoints and stops the job (exit code 3)."""
import os
import re
import signal
import subprocess
import sys

import pytest

from tests.helpers.launch import ROOT, mpiexec, run_mpi
from tests.test_resilience import _python_children

SCRIPT = ROOT / "examples/train_gpt.py"
TINY = ["--steps", "20", "--eval-every", "10", "--n-embd", "32", "--block-size", "16",
        "--sample-tokens", "8", "--max-ratio", "2"]
LINE = re.compile(r"step +(\d+) +train loss ([\d.]+) +val loss ([\d.]+) +lr ([\d.e+-]+)")


def run(tmp, *args, n=4):
    code, out, err, _ = run_mpi(n, SCRIPT, "--data-dir", tmp / "data", *TINY, *args,
                                timeout=120)
    return code, out, err


def losses(out):
    return [tuple(float(v) for v in line) for line in LINE.findall(out)]


@pytest.fixture(scope="module")
def data_parallel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpt")
    code, out, err = run(tmp)
    assert code == 0, err
    assert "(dp 4 x tp 1 x pp 1)" in out and "loss check passed" in out and "sample:" in out
    assert len(losses(out)) == 2
    return tmp, out


@pytest.mark.parametrize("mode", [["--tp", "2"], ["--pp", "2"], ["--fsdp"]],
                         ids=lambda m: m[0][2:])
def test_each_mode_trains_what_data_parallel_trains(data_parallel, mode):
    tmp, reference = data_parallel
    code, out, err = run(tmp, *mode)
    assert code == 0, err
    assert "loss check passed" in out and "tokens/s" in out and "sample:" in out
    got, want = losses(out), losses(reference)
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=2e-4), (mode, got, want)


def test_tp_resume_prints_the_uninterrupted_loss_lines(data_parallel):
    tmp, _ = data_parallel
    code, whole, err = run(tmp, "--tp", "2")
    assert code == 0, err
    ckpt = ["--tp", "2", "--checkpoint-dir", str(tmp / "ckpt")]
    code, first, err = run(tmp, *ckpt, "--stop-after", "15")  # between two reports
    assert code == 3, err
    assert "stopped after step 15" in first and "step    20" not in first
    code, second, err = run(tmp, *ckpt)
    assert code == 0, err
    assert "resumed from" in second and "step    10" not in second
    assert LINE.findall(first) + LINE.findall(second) == LINE.findall(whole)


def test_unsupported_combinations_fail_with_a_message(tmp_path):
    code, out, err = run(tmp_path, "--fsdp", "--pp", "2", n=2)
    assert code != 0 and "--fsdp runs with --tp 1 --pp 1" in out + err


def test_train_gpt_short_run_on_a_given_text_file_passes_a_relaxed_check(tmp_path):
    text = tmp_path / "alice.txt"  # --data FILE: any text (here the corpus, lower case)
    text.write_text((ROOT / "spmdnet/data/corpus.txt").read_text().lower())
    code, out, err, _ = run_mpi(2, SCRIPT, "--data", text,
                                "--data-dir", tmp_path, "--steps", "40", "--eval-every", "20",
                                "--sample-tokens", "20", "--max-ratio", "0.95", timeout=180)
    assert code == 0, err
    assert "loss check passed" in out and "tokens/s" in out and "sample:" in out
    assert len(re.findall(r"step +\d+ +train loss", out)) == 2


def test_sigterm_to_one_rank_checkpoints_and_stops(tmp_path):
    args = [*TINY, "--steps", "100000", "--eval-every", "5", "--data-dir", tmp_path / "data",
            "--checkpoint-dir", tmp_path / "ck"]  # the later --steps wins
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [mpiexec(), "-n", "2", sys.executable, str(SCRIPT), *map(str, args)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:  # after a report every rank's handler is in place
        next(line for line in proc.stdout if line.startswith("step"))
        *_, one = _python_children(proc.pid, str(SCRIPT))
        os.kill(one, signal.SIGTERM)  # one rank only
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3, err
    step = int(out.split("stopped after step")[1].split()[0])
    assert f"ckpt-{step:08d}.h5" in os.listdir(tmp_path / "ck")
