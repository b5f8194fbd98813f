"""The examples run as their docstrings say and pass their own checks."""
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import h5py
import numpy as np
import pytest

from spmdnet import cli
from spmdnet.data import datasets
from tests.helpers.launch import ROOT, load_example, run_mpi
from tests.test_hdf5 import Solo


def epochs(out):
    """The epoch lines of train_mlp.py and train_3d.py without their samples/s."""
    return [line.rsplit(")", 1)[0] for line in out.splitlines() if line.startswith("epoch")]


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
    assert len(epochs(out_mlp)) == 2 and epochs(out_3d) == epochs(out_mlp)


def test_train_3d_fsdp_without_tp_and_pp_trains_what_train_mlp_trains(tmp_path):
    """--tp 1 --pp 1 --fsdp (issue 26: it crashed, untested): FSDP over every
    rank trains train_mlp's model, so the same epoch lines."""
    common = ["--epochs", "2", "--data-dir", tmp_path, "--min-accuracy", "0"]
    code, out_fsdp, err, _ = run_mpi(2, ROOT / "examples/train_3d.py", "--tp", "1", "--pp",
                                     "1", "--fsdp", *common, timeout=300)
    assert code == 0, err
    assert "(dp 2 x tp 1 x pp 1), FSDP" in out_fsdp
    code, out_mlp, err, _ = run_mpi(2, ROOT / "examples/train_mlp.py", *common, "--metrics",
                                    tmp_path / "m.jsonl", timeout=300)
    assert code == 0, err
    assert len(epochs(out_mlp)) == 2 and epochs(out_fsdp) == epochs(out_mlp)


def test_train_3d_with_fsdp_trains_what_data_parallel_trains(tmp_path):
    """--fsdp (FSDP over mesh.dp x TP 2) passes its check with the epoch losses
    and accuracies of DataParallel over the same mesh (the same mathematics)."""
    common = ["--tp", "2", "--pp", "1", "--epochs", "6", "--data-dir", tmp_path]
    code, out_fsdp, err, _ = run_mpi(4, ROOT / "examples/train_3d.py", "--fsdp", *common,
                                     timeout=300)
    assert code == 0, err
    assert "(dp 2 x tp 2 x pp 1), FSDP" in out_fsdp and "accuracy check passed" in out_fsdp
    code, out_ddp, err, _ = run_mpi(4, ROOT / "examples/train_3d.py", *common, timeout=300)
    assert code == 0, err
    assert len(epochs(out_fsdp)) == 6 and epochs(out_fsdp) == epochs(out_ddp)


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


def test_train_cnn_with_sync_batchnorm_passes_its_check(tmp_path):
    code, out, err, _ = run_mpi(4, ROOT / "examples/train_cnn.py", "--data-dir", tmp_path,
                                "--epochs", "3", timeout=300)
    assert code == 0, err
    assert re.search(r"epoch 2: loss [0-9.]+, accuracy 0\.9[5-9]", out), out
    assert "accuracy check passed" in out


def test_train_cnn_cifar_net_on_a_converted_cifar_file(tmp_path):
    """--model cifar-net --data on a tiny CIFAR-shaped file written from the
    binary batch format, with augmentation, on 2 ranks."""
    rng = np.random.default_rng(0)
    for name, n in (("train", 32), ("test", 8)):
        records = rng.integers(0, 256, (n, 3073), dtype=np.uint8)
        records[:, 0] %= 10
        (tmp_path / f"{name}.bin").write_bytes(records.tobytes())
        datasets.make_cifar10(tmp_path / f"{name}.bin", tmp_path / f"{name}.h5",
                              comm=Solo())
    code, out, err, _ = run_mpi(2, ROOT / "examples/train_cnn.py", "--model", "cifar-net",
                                "--data", tmp_path / "train.h5", "--test-data",
                                tmp_path / "test.h5", "--epochs", "1", "--batch-size", "4",
                                "--augment", "--min-accuracy", "0", timeout=120)
    assert code == 0, err
    assert re.search(r"epoch 0: loss [0-9.]+, accuracy [0-9.]+", out), out


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


_example = load_example


BAD_OPTIONS = [
    ("train_mlp", "--epochs", "-1"), ("train_mlp", "--epochs", "0"),
    ("train_mlp", "--checkpoint-every", "-1"), ("train_mlp", "--stop-after", "-1"),
    ("train_mlp", "--hidden", "0"), ("train_mlp", "--lr", "-1"), ("train_mlp", "--lr", "nan"),
    ("train_mlp", "--batch-size", "0"), ("train_mlp", "--dropout", "1.5"),
    ("train_mlp", "--seed", "-1"), ("train_mlp", "--min-accuracy", "2"),
    ("train_3d", "--tp", "0"), ("train_3d", "--pp", "-1"), ("train_3d", "--micro-batches", "0"),
    ("train_3d", "--epochs", "-1"), ("train_3d", "--hidden", "0"), ("train_3d", "--lr", "-1"),
    ("train_ddp", "--epochs", "-1"), ("train_ddp", "--batch-size", "0"),
    ("train_ddp", "--min-accuracy", "-0.5"), ("train_cnn", "--batch-size", "0"),
    ("train_cnn", "--lr", "-1"), ("train_cnn", "--model", "resnet"),
    ("compute_pi", "--intervals", "0"),
    ("tensor_parallel_mlp", "--tp", "-1"), ("tensor_parallel_mlp", "--hidden", "0"),
    ("tensor_parallel_mlp", "--tolerance", "-1"), ("train_mlp", "--epochs", "abc"),
]


@pytest.mark.parametrize("name, option, value", BAD_OPTIONS)
def test_a_bad_option_value_is_an_argparse_error_naming_it(name, option, value, capsys):
    """Refused at parsing (exit code 2), before MPI starts, with the option and
    the value as given (--lr -1, not the scaled learning rate)."""
    with pytest.raises(SystemExit) as stopped:
        _example(name).main([option, value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: " in err and value in err, err


def test_a_bad_option_value_exits_2_from_the_command_line():
    proc = subprocess.run([sys.executable, "examples/train_mlp.py", "--hidden", "0"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "argument --hidden: 0 is not a positive integer" in \
        proc.stderr, proc.stderr


def test_cli_types_accept_good_values_and_name_bad_ones():
    assert cli.positive_int("3") == 3 and cli.non_negative_int("0") == 0
    assert cli.positive_float("1e-3") == 1e-3 and cli.probability("1") == 1.0
    for parse, text in [(cli.positive_int, "1.5"), (cli.positive_float, "inf"),
                        (cli.probability, "-0.1"), (cli.non_negative_int, "-2")]:
        with pytest.raises(Exception, match=f"{text}.* is not "):
            parse(text)


def test_a_file_in_place_of_the_checkpoint_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file")
    code, out, err, _ = run_mpi(2, ROOT / "examples/train_mlp.py", "--checkpoint-dir",
                                blocker, "--data-dir", tmp_path, "--metrics",
                                tmp_path / "m.jsonl", timeout=120)
    assert code != 0 and str(blocker) in err, err
    assert "CheckpointError" in err and "epoch" not in out, out


def test_a_test_set_of_other_features_fails_before_training(tmp_path):
    rng = np.random.default_rng(0)
    train, test = tmp_path / "train.h5", tmp_path / "test.h5"
    for path, n, features in ((train, 64, 8), (test, 16, 5)):  # 8 features, then 5
        with h5py.File(path, "w") as f:
            f["x"], f["y"] = rng.random((n, features), np.float32), np.arange(n) % 2
    proc = subprocess.run([sys.executable, "examples/train_mlp.py", "--data", str(train),
                           "--test-data", str(test), "--metrics", str(tmp_path / "m.jsonl")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0 and str(train) in proc.stderr and str(test) in proc.stderr
    assert "epoch" not in proc.stdout, proc.stdout


def test_metrics_keep_one_line_per_epoch_across_stops_and_resumes(tmp_path):
    """Stops mid-epoch, at an epoch's last step and at the run's last step
    (11 steps per epoch at 2 ranks x 64); after resuming, metrics.jsonl holds
    epochs 0, 1, 2 once each, with the uninterrupted run's values."""
    common = ["--epochs", "3", "--batch-size", "64", "--min-accuracy", "0", "--data-dir",
              tmp_path]

    def run(metrics, *extra):
        code, out, err, _ = run_mpi(2, ROOT / "examples/train_mlp.py", *common, "--metrics",
                                    metrics, *extra, timeout=300)
        return code, out, err

    code, out, err = run(tmp_path / "full.jsonl")
    assert code == 0 and "11 steps/epoch" in out, err
    part = ["--checkpoint-dir", tmp_path / "ck"]
    for stop in (5, 11, 16, 33):  # mid-epoch 0, end of 0, mid-epoch 1, end of the run
        code, out, err = run(tmp_path / "part.jsonl", *part, "--stop-after", stop)
        assert code == 3 and f"stopped after step {stop}" in out, err
    code, out, err = run(tmp_path / "part.jsonl", *part)
    assert code == 0 and "resumed from" in out, err

    def records(name):
        return [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]

    full, part = records("full.jsonl"), records("part.jsonl")
    assert [r["epoch"] for r in part] == [0, 1, 2]
    for a, b in zip(full, part):
        del a["samples_per_s"], b["samples_per_s"]
        assert a == b


def test_train_mlp_resumes_on_other_numbers_of_ranks_with_the_global_batch(tmp_path):
    """Checkpointed at 2 ranks x 16, resumed at 1 rank x 32, then at 4 ranks
    x 8: every step trains on the uninterrupted 2-rank run's samples, so the
    epoch records equal that run's up to the reduction order, and the job
    reaches its self-check. Another per-rank batch without the ranks to keep
    the global batch is refused, naming it."""
    common = ["--epochs", "2", "--min-accuracy", "0.85", "--data-dir", tmp_path]

    def run(n, batch, metrics, *extra):
        code, out, err, _ = run_mpi(n, ROOT / "examples/train_mlp.py", *common, "--batch-size",
                                    batch, "--metrics", metrics, *extra, timeout=300)
        return code, out, err

    code, out, err = run(2, 16, tmp_path / "full.jsonl")
    assert code == 0 and "44 steps/epoch" in out, err
    part = ["--checkpoint-dir", tmp_path / "ck"]
    code, out, err = run(2, 16, tmp_path / "part.jsonl", *part, "--stop-after", "20")
    assert code == 3 and "stopped after step 20" in out, err
    code, out, err = run(2, 8, tmp_path / "part.jsonl", *part)
    assert code != 0 and "'global_batch': (32, 16)" in err, err
    code, out, err = run(1, 32, tmp_path / "part.jsonl", *part, "--stop-after", "60")
    assert code == 3 and "resumed from" in out and "at step 20, epoch 0" in out, err
    assert "stopped after step 60" in out
    code, out, err = run(4, 8, tmp_path / "part.jsonl", *part)
    assert code == 0 and "at step 60, epoch 1" in out and "accuracy check passed" in out, err

    def records(name):
        return [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]

    full, part = records("full.jsonl"), records("part.jsonl")
    assert [r["epoch"] for r in part] == [0, 1]
    for a, b in zip(full, part):
        for key in ("train_loss", "val_loss", "val_accuracy", "lr"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (key, a, b)
