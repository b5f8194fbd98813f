"""examples/ddp_course.py, the course's DDP program in PyTorch's spellings
(issue 24 item 8), run with plain python (spawn starts 2 MPI ranks) and
under mpiexec -n 2 (spawn runs on the existing ranks): both launches train
the same model (same losses to the digit), the loss falls and the classes
are learnt."""
import re
import subprocess
import sys
from pathlib import Path

from spmdnet import launch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ddp_course.py"


def _report(stdout):
    losses = [float(v) for v in re.findall(r"epoch \d+: loss ([0-9.]+)", stdout)]
    accuracy = re.findall(r"accuracy ([0-9.]+) on 2 ranks", stdout)
    return losses, accuracy


def test_course_ddp_program_runs_via_spawn_and_under_mpiexec():
    spawned = subprocess.run([sys.executable, str(EXAMPLE), "--epochs", "3"],
                             capture_output=True, text=True, timeout=240,
                             env=launch.job_env())
    assert spawned.returncode == 0, spawned.stderr
    launched = launch.run(2, EXAMPLE, "--epochs", "3", timeout=240)
    assert launched.returncode == 0, launched.stderr
    losses, accuracy = _report(spawned.stdout)
    assert len(losses) == 3 and losses[-1] < losses[0] / 10
    assert len(accuracy) == 1 and float(accuracy[0]) > 0.95
    assert _report(launched.stdout) == (losses, accuracy)  # printed once, by rank 0
