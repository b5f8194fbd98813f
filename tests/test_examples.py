"""The examples run as their docstrings say and pass their own checks."""
import subprocess
import sys

from launch import ROOT, run_mpi


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


def test_train_mlp_3d_on_eight_ranks_passes_its_check(tmp_path):
    code, out, err, _ = run_mpi(8, ROOT / "examples/train_mlp.py", "--tp", "2", "--pp", "2",
                                "--epochs", "8", "--data-dir", tmp_path, "--metrics",
                                tmp_path / "m.jsonl", timeout=600)
    assert code == 0, err
    assert "(dp 2 x tp 2 x pp 2)" in out and "accuracy check passed" in out


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
