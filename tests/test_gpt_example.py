"""examples/gpt/: the data-parallel, tensor-parallel, pipeline and FSDP
trainers train the same model (the same loss lines, up to rounding); each,
stopped and resumed from its checkpoint, prints its uninterrupted run's loss
lines; SIGTERM to one rank checkpoints and stops the job (exit code 3)."""
import functools
import os
import re
import signal
import subprocess
import sys

import pytest

from spmdnet.data import datasets
from tests.helpers.launch import ROOT, mpiexec, run_mpi
from tests.test_resilience import _python_children

GPT = ROOT / "examples/gpt"
TRAINERS = {"dp": ["train_dp.py"], "tp": ["train_tp.py", "--tp", "2"],
            "pp": ["train_pp.py", "--pp", "2"], "fsdp": ["train_fsdp.py"]}
HEADERS = {"dp": "(dp 4 x tp 1 x pp 1)", "tp": "(dp 2 x tp 2 x pp 1)",
           "pp": "(dp 2 x tp 1 x pp 2)", "fsdp": "(dp 4 x tp 1 x pp 1 FSDP)"}
TINY = ["--steps", "20", "--eval-every", "10", "--n-embd", "32", "--block-size", "16",
        "--sample-tokens", "8", "--max-ratio", "2"]
LINE = re.compile(r"step +(\d+) +train loss ([\d.]+) +val loss ([\d.]+) +lr ([\d.e+-]+)")


def run(tmp, mode, *args, n=4):
    script, *options = TRAINERS[mode]
    code, out, err, _ = run_mpi(n, GPT / script, *options, "--data-dir", tmp / "data", *TINY,
                                *args, timeout=120)
    return code, out, err


def losses(out):
    return [tuple(float(v) for v in line) for line in LINE.findall(out)]


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    """The uninterrupted run of a trainer (each run once)."""
    tmp = tmp_path_factory.mktemp("gpt")

    @functools.cache
    def whole(mode):
        code, out, err = run(tmp, mode)
        assert code == 0, err
        assert HEADERS[mode] in out and "loss check passed" in out and "sample:" in out
        assert "tokens/s" in out and len(losses(out)) == 2
        return out
    return tmp, whole


@pytest.mark.parametrize("mode", ["tp", "pp", "fsdp"])
def test_each_trainer_trains_what_data_parallel_trains(whole_run, mode):
    _, whole = whole_run
    got, want = losses(whole(mode)), losses(whole("dp"))
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=2e-4), (mode, got, want)


@pytest.mark.parametrize("mode", ["dp", "tp", "pp", "fsdp"])
def test_resume_prints_the_uninterrupted_loss_lines(whole_run, mode):
    tmp, whole = whole_run
    ckpt = ["--checkpoint-dir", str(tmp / f"ckpt-{mode}")]
    code, first, err = run(tmp, mode, *ckpt, "--stop-after", "15")  # between two reports
    assert code == 3, err
    assert "stopped after step 15" in first and "step    20" not in first
    code, second, err = run(tmp, mode, *ckpt)
    assert code == 0, err
    assert "resumed from" in second and "step    10" not in second
    assert LINE.findall(first) + LINE.findall(second) == LINE.findall(whole(mode))


def test_resume_with_other_options_is_refused_naming_them(whole_run):
    tmp, _ = whole_run
    ckpt = ["--checkpoint-dir", str(tmp / "ckpt-options")]
    code, _, err = run(tmp, "dp", *ckpt, "--stop-after", "5", n=2)
    assert code == 3, err
    code, out, err = run(tmp, "dp", *ckpt, "--lr", "0.01", n=2)
    assert code != 0 and "'lr': (0.003, 0.01)" in err and not LINE.findall(out), err


def test_a_pipeline_that_cannot_be_cut_fails_with_a_message(tmp_path):
    code, out, err = run(tmp_path, "pp", "--batch-size", "6", n=2)
    assert code != 0 and "--batch-size 6 is not a multiple of --micro-batches 4" in out + err
    code, out, err = run(tmp_path, "pp", "--pp", "3", n=3)
    assert code != 0 and "--pp 3 exceeds --n-layer 2" in out + err


def test_train_dp_short_run_on_a_given_text_file_passes_a_relaxed_check(tmp_path):
    text = tmp_path / "alice.txt"  # --data FILE: any text (here the corpus, lower case)
    text.write_text(datasets.read_text(None).lower())
    code, out, err, _ = run_mpi(2, GPT / "train_dp.py", "--data", text,
                                "--data-dir", tmp_path, "--steps", "40", "--eval-every", "20",
                                "--sample-tokens", "20", "--max-ratio", "0.95", timeout=180)
    assert code == 0, err
    assert "loss check passed" in out and "tokens/s" in out and "sample:" in out
    assert len(re.findall(r"step +\d+ +train loss", out)) == 2


def test_sigterm_to_one_rank_checkpoints_and_stops(tmp_path):
    script = GPT / "train_dp.py"
    args = [*TINY, "--steps", "100000", "--eval-every", "5", "--data-dir", tmp_path / "data",
            "--checkpoint-dir", tmp_path / "ck"]  # the later --steps wins
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [mpiexec(), "-n", "2", sys.executable, str(script), *map(str, args)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:  # after a report every rank's handler is in place
        next(line for line in proc.stdout if line.startswith("step"))
        *_, one = _python_children(proc.pid, str(script))
        os.kill(one, signal.SIGTERM)  # one rank only
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3, err
    step = int(out.split("stopped after step")[1].split()[0])
    assert f"ckpt-{step:08d}.h5" in os.listdir(tmp_path / "ck")
