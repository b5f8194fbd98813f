"""Crash, stall and resume behaviour of real MPI jobs, each launched from a
serial test with a deadline (a hang fails the test instead of CI)."""
import glob
import os
import signal
import subprocess
import sys
import textwrap

import h5py
import numpy as np

from tests.helpers.launch import ROOT, mpiexec, run_mpi

TRAIN = ROOT / "examples/train_mlp.py"


def final_model(directory):
    path = sorted(glob.glob(f"{directory}/ckpt-*.h5"))[-1]
    with h5py.File(path, "r") as f:
        return path, {k: f["model"][k][()] for k in f["model"]}


def test_resume_equals_uninterrupted_bitwise(tmp_path):
    common = ["--epochs", "2", "--dropout", "0.2", "--data-dir", tmp_path / "data",
              "--min-accuracy", "0", "--metrics", tmp_path / "m.jsonl"]
    code, _, err, _ = run_mpi(2, TRAIN, *common, "--checkpoint-dir", tmp_path / "full",
                              timeout=300)
    assert code == 0, err
    # stop mid-epoch 0 (epoch 0 has 44 steps at 2 ranks x 16), then resume in a new job
    code, out, err, _ = run_mpi(2, TRAIN, *common, "--checkpoint-dir", tmp_path / "part",
                                "--stop-after", "30", timeout=300)
    assert code == 3 and "stopped after step 30" in out, err
    code, out, err, _ = run_mpi(2, TRAIN, *common, "--checkpoint-dir", tmp_path / "part",
                                timeout=300)
    assert code == 0 and "resumed from" in out and "samples into it" in out, err
    path_a, a = final_model(tmp_path / "full")
    path_b, b = final_model(tmp_path / "part")
    assert os.path.basename(path_a) == os.path.basename(path_b)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_signal_to_one_rank_stops_all_at_one_step(tmp_path):
    args = ["--epochs", "200", "--data-dir", tmp_path / "data", "--checkpoint-dir",
            tmp_path / "ck", "--metrics", tmp_path / "m.jsonl"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [mpiexec(), "-n", "2", sys.executable, str(TRAIN), *map(str, args)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # the first epoch's line: every rank's handler is in place
            if line.startswith("epoch"):
                break
        pids = _python_children(proc.pid, str(TRAIN))
        assert len(pids) == 2, pids
        os.kill(pids[-1], signal.SIGUSR1)  # one rank only
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3, err
    assert "stopped after step" in out
    step = int(out.split("stopped after step")[1].split()[0])
    assert sorted(os.listdir(tmp_path / "ck"))[-2] == f"ckpt-{step:08d}.h5"


def _python_children(root_pid, marker):
    """PIDs of the processes under root_pid whose command line contains marker."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and sys.executable in cmdline and "mpiexec" not in cmdline \
                and _descends_from(int(pid), root_pid):
            found.append(int(pid))
    return sorted(found)


def _descends_from(pid, root_pid):
    """Whether root_pid is an ancestor of pid (other jobs may run the same script)."""
    while pid > 1:
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent's pid
        if pid == root_pid:
            return True
    return False


SLEEPER = textwrap.dedent("""
    import time
    import numpy as np
    from spmdnet import dist
    dist.init()
    dist.allreduce(np.ones(2))
    if dist.rank() == 1:
        time.sleep(60)  # late: never reaches the next allreduce in time
    dist.allreduce(np.ones(2))
""")


def test_watchdog_names_the_late_rank_and_aborts(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    code, out, err, seconds = run_mpi(3, script, timeout=60, env={
        "SPMDNET_WATCHDOG_S": "1.5", "SPMDNET_WATCHDOG_ABORT_S": "4"})
    assert code != 0 and seconds < 20, (seconds, err)
    assert "watchdog (stalled)" in err and "watchdog (aborting the job)" in err
    assert "allreduce(sum) #2" in err and "ranks not in it: [1]" in err
    assert "rank 1: not in a collective; last finished allreduce(sum) #1" in err
    assert "sleeper.py:9" in err  # the call site of the stalled collective


KILLER = textwrap.dedent("""
    import os, signal
    import numpy as np
    from spmdnet import dist
    dist.init()
    for step in range(10000):
        if step == 5 and dist.rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.allreduce(np.ones(1000))
""")


def test_sigkill_of_one_rank_ends_the_job(tmp_path):
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    code, _, _, seconds = run_mpi(3, script, timeout=60)
    assert code != 0 and seconds < 30


CKPT_CRASH = textwrap.dedent("""
    import os, sys
    import spmdnet as sn
    from spmdnet import dist, nn
    from spmdnet.checkpoint import files
    dist.init()
    model = nn.Linear(3, 2)
    sn.save_checkpoint(sys.argv[1], model, step=1)
    if dist.rank() == 0:  # rank 0 dies halfway through writing the next one
        files.fsync = lambda path: os._exit(9)
    sn.save_checkpoint(sys.argv[1], model, step=2)
""")


def test_rank_killed_while_writing_leaves_previous_checkpoint(tmp_path):
    script = tmp_path / "ckpt_crash.py"
    script.write_text(CKPT_CRASH)
    target = tmp_path / "ck"
    code, _, err, seconds = run_mpi(2, script, str(target) + "/", timeout=60)
    assert code != 0 and seconds < 30
    assert sorted(p.name for p in target.iterdir() if not p.name.startswith(".")) == [
        "ckpt-00000001.h5", "latest"]
    with h5py.File(target / "ckpt-00000001.h5", "r") as f:
        assert f.attrs["complete"]
