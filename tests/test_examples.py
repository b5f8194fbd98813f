"""The examples run as their docstrings say and pass their own checks."""
import subprocess
import sys

from launch import ROOT, run_mpi


def test_compute_pi_on_four_ranks():
    code, out, err, _ = run_mpi(4, ROOT / "examples/compute_pi.py", "--intervals", "100000")
    assert code == 0, err
    assert "on 4 ranks" in out and "error" in out


def test_train_mlp_reaches_its_accuracy_bar():
    proc = subprocess.run([sys.executable, "examples/train_mlp.py", "--epochs", "150"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "accuracy check passed" in proc.stdout
