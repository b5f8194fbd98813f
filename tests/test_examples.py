"""The examples run as their docstrings say and pass their own checks."""
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from tests.helpers.launch import ROOT, run_mpi


def test_compute_pi_on_four_ranks():
    code, out, err, _ = run_mpi(4, ROOT / "examples/compute_pi.py", "--intervals", "100000")
    assert code == 0, err
    assert "on 4 ranks" in out and "error" in out


def test_train_mlp_on_four_ranks_passes_its_check(tmp_path):
    code, out, err, _ = run_mpi(4, ROOT / "examples/train_mlp.py", "--epochs", "8",
                                "--data-dir", tmp_path, "--metrics", tmp_path / "m.jsonl",
                                timeout=300)
    assert code == 0, err
    assert "accuracy check passed" in out
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert len(lines) == 8 and '"val_accuracy"' in lines[-1]


def test_train_mlp_runs_as_plain_python(tmp_path):
    proc = subprocess.run([sys.executable, "examples/train_mlp.py", "--epochs", "3",
                           "--data-dir", str(tmp_path), "--metrics", str(tmp_path / "m.jsonl"),
                           "--min-accuracy", "0.9"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "1 ranks" in proc.stdout and "accuracy check passed" in proc.stdout


def test_train_3d_on_eight_ranks_passes_its_check(tmp_path):
    code, out, err, _ = run_mpi(8, ROOT / "examples/train_3d.py", "--tp", "2", "--pp", "2",
                                "--epochs", "8", "--data-dir", tmp_path, timeout=600)
    assert code == 0, err
    assert "(dp 2 x tp 2 x pp 2)" in out and "accuracy check passed" in out


def test_train_3d_without_tp_and_pp_trains_what_train_mlp_trains(tmp_path):
    """--tp 1 --pp 1 is train_mlp's model, data, schedule and seed: the same
    epoch losses and validation accuracies."""
    common = ["--epochs", "2", "--data-dir", tmp_path, "--min-accuracy", "0"]
    code, out_3d, err, _ = run_mpi(2, ROOT / "examples/train_3d.py", "--tp", "1", "--pp", "1",
                                   *common, timeout=300)
    assert code == 0, err
    code, out_mlp, err, _ = run_mpi(2, ROOT / "examples/train_mlp.py", *common, "--metrics",
                                    tmp_path / "m.jsonl", timeout=300)
    assert code == 0, err

    def epochs(out):  # the epoch lines without their samples/s
        return [line.rsplit(")", 1)[0] for line in out.splitlines() if line.startswith("epoch")]

    assert len(epochs(out_mlp)) == 2 and epochs(out_3d) == epochs(out_mlp)


def test_tensor_parallel_demo_matches_dense():
    code, out, err, _ = run_mpi(2, ROOT / "examples/tensor_parallel_mlp.py", timeout=120)
    assert code == 0, err
    assert "matches the dense block" in out


def test_train_mlp_profile_prints_the_breakdown(tmp_path):
    code, out, err, _ = run_mpi(2, ROOT / "examples/train_mlp.py", "--epochs", "2",
                                "--profile", "--min-accuracy", "0", "--data-dir", tmp_path,
                                "--metrics", tmp_path / "m.jsonl", timeout=300)
    assert code == 0, err
    assert "step breakdown on 2 ranks" in out and "T(N) = parallel" in out


def test_train_ddp_is_the_readme_example_and_passes_its_check(tmp_path):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A short example", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == (ROOT / "examples/train_ddp.py").read_text(), \
        "README.md's short example must be examples/train_ddp.py, exactly"
    code, out, err, _ = run_mpi(2, ROOT / "examples/train_ddp.py", "--data-dir", tmp_path,
                                timeout=300)
    assert code == 0, err
    assert "epoch 4: loss" in out and "accuracy check passed" in out


def test_progress_bar_on_a_terminal_only(tmp_path):
    """tqdm draws a bar on a terminal; into a pipe (as under Slurm) only the
    epoch and result lines are written."""
    pytest.importorskip("tqdm")
    args = [sys.executable, "examples/train_mlp.py", "--epochs", "1", "--min-accuracy", "0",
            "--data-dir", str(tmp_path), "--metrics", str(tmp_path / "m.jsonl")]
    piped = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert piped.returncode == 0, piped.stderr
    assert "\r" not in piped.stdout + piped.stderr and "it/s" not in piped.stdout
    assert "epoch   0  loss" in piped.stdout
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    proc = subprocess.Popen(args, stdout=terminal, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal closed: the process has ended
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    text = shown.decode(errors="replace")
    steps = re.search(r"(\d+) steps/epoch", text).group(1)
    assert re.search(rf"epoch 0: +\d+%\|.*\| \d+/{steps} \[", text), text  # the bar
    assert "epoch   0  loss" in text and "accuracy check passed" in text


def test_stop_exits_3_under_python_m_mpi4py_without_abort(tmp_path):
    """A stopped run exits 3 on every rank (what requeueing tests for), also
    under `python -m mpi4py`, which turns a non-zero SystemExit into MPI_Abort
    unless MPI was finalized first (dist.finalize_and_exit)."""
    code, out, err, _ = run_mpi(2, "-m", "mpi4py", ROOT / "examples/train_mlp.py", "--epochs",
                                "1", "--stop-after", "5", "--checkpoint-dir", tmp_path / "ck",
                                "--data-dir", tmp_path, "--metrics", tmp_path / "m.jsonl",
                                timeout=300)
    assert code == 3, err
    assert "stopped after step 5" in out and "MPI_Abort" not in err + out
