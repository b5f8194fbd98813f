"""The job scripts in jobs/ on a real Slurm, and spmdnet.distributed.slurm.

The `slurm` tests start the one-node Slurm of jobs/local-slurm (installing Debian's
slurm-wlm and munge when missing), submit jobs/train_mlp_cpu.sbatch and
jobs/train_mlp_requeue.sbatch with `sbatch --wait`, stop one job with the signal its
time limit would send, and check that it was requeued and resumed. Skipped where
Slurm cannot be started (not root, no apt-get, the install fails); leave them out
with `-m "not slurm"`.
"""
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.helpers.launch import ROOT

from spmdnet.distributed import slurm as sl

LOCAL_SLURM = ROOT / "jobs" / "local-slurm"
CANNOT_START = 77  # start.sh's exit code when Slurm cannot be provided here


# -- spmdnet.distributed.slurm, no Slurm needed --------------------------------------------------
def test_describe_job_outside_slurm_is_none():
    assert sl.describe_job(env={"PATH": "/bin"}) is None


def test_describe_job_names_job_step_nodes_and_tasks():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NAME": "train", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_JOB_NODELIST": "n[01-02]", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0",
           "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "8",
           "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_CPUS_PER_TASK": "4",
           "SLURM_RESTART_COUNT": "1", "SLURM_JOB_PARTITION": "gpu"}
    line = sl.describe_job(world_size=8, env=env)
    assert line == ("Slurm job 42 'train' step 0, requeued 1x: 2 nodes (n[01-02]), 8 tasks, "
                    "tasks/node 4(x2), CPUs/task 4, partition gpu")


def test_describe_job_warns_when_mpi_does_not_see_the_srun_tasks():
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4"}
    line = sl.describe_job(world_size=1, env=env)
    assert "srun started 4 tasks but MPI sees a world of 1" in line and "--mpi=pmi2" in line
    assert "WARNING" not in sl.describe_job(world_size=4, env=env)
    # plain python in a batch script (no step) is not a launch mistake
    assert "WARNING" not in sl.describe_job(world_size=1, env={"SLURM_JOB_ID": "7",
                                                               "SLURM_NTASKS": "4"})


def test_stale_mpich_segments_spares_files_in_use(tmp_path):
    stale, other = tmp_path / "mpich_shm_1234_0", tmp_path / "not_mpich"
    busy = tmp_path / "mpich_shm_5678_0"
    for path in (stale, other, busy):
        path.write_bytes(b"\0" * 64)
    with open(busy, "rb"):  # held open by this process
        assert sl.stale_mpich_segments(tmp_path) == [stale]
        assert sl.clean_stale_mpich_segments(tmp_path) == [stale]
    assert not stale.exists() and other.exists() and busy.exists()
    assert sl.stale_mpich_segments(tmp_path / "missing") == []


# -- the job scripts on the local Slurm -----------------------------------------------------
def _run(cmd, env, timeout=60, check=True):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=ROOT)
    if check:
        assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout}" \
                                     f"\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def slurm_env():
    """The environment for sbatch & co. against the local Slurm, started here (and
    stopped afterwards) unless it was already up."""
    start = subprocess.run([str(LOCAL_SLURM / "start.sh")], capture_output=True, text=True,
                           timeout=900)
    if start.returncode == CANNOT_START:
        pytest.skip(start.stderr.strip() or "local Slurm cannot be started here")
    assert start.returncode == 0, f"start.sh failed:\n{start.stdout}\n{start.stderr}"
    directory = os.environ.get("LOCAL_SLURM_DIR", "/tmp/spmdnet-slurm")
    env = dict(os.environ, SLURM_CONF=f"{directory}/slurm.conf", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1")
    # the job scripts run `python`: let it be the interpreter running these tests
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    yield env
    if "already up" not in start.stdout:
        subprocess.run([str(LOCAL_SLURM / "stop.sh")], capture_output=True, timeout=120)


class Submission:
    """`sbatch --wait` of one job script, in a thread; join() returns the job id."""

    def __init__(self, script, env, out_dir, **job_env):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.output = out_dir / "job.out"
        self.name = f"spmdnet-test-{Path(script).stem}-{os.getpid()}"
        self.cmd = ["sbatch", "--wait", "--parsable", f"--job-name={self.name}",
                    f"--output={self.output}", str(ROOT / "jobs" / script)]
        self.env = dict(env, OUT_DIR=str(out_dir / "out"), DATA_DIR=str(out_dir / "data"),
                        **job_env)
        self.proc, self.t0 = None, time.perf_counter()
        self.thread = threading.Thread(target=self._wait)
        self.thread.start()

    def _wait(self):
        self.proc = subprocess.run(self.cmd, capture_output=True, text=True, env=self.env,
                                   cwd=ROOT, timeout=400)
        self.seconds = time.perf_counter() - self.t0

    def text(self):
        return self.output.read_text() if self.output.exists() else ""

    def join(self, timeout):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.cmd} still waiting:\n{self.text()}"
        assert self.proc.returncode == 0, (f"{self.cmd} exited {self.proc.returncode}:\n"
                                           f"{self.proc.stderr}\n{self.text()}")
        return int(self.proc.stdout.split(";")[0])


def job_fields(env, job_id):
    """`scontrol show job` as a dict (finished jobs stay for MinJobAge seconds)."""
    out = _run(["scontrol", "show", "job", str(job_id)], env).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.5)


@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_cpu_job_and_requeued_job_complete_on_slurm(slurm_env, tmp_path):
    cpu = Submission("train_mlp_cpu.sbatch", slurm_env, tmp_path / "cpu", EPOCHS="8")
    requeue = Submission("train_mlp_requeue.sbatch", slurm_env, tmp_path / "requeue",
                         EPOCHS="20", CHECKPOINT_EVERY="10")
    try:
        # The time limit's warning, sent now: USR1 to the batch script (as
        # --signal=B:USR1@90 does) once training has started.
        wait_for(lambda: "steps/epoch" in requeue.text() or not requeue.thread.is_alive(),
                 300, "the requeue job to start training")
        first = re.search(r"job (\d+), run 1", requeue.text())
        assert first, (requeue.proc and requeue.proc.stderr, requeue.text())
        _run(["scancel", "--signal=USR1", "--batch", first.group(1)], slurm_env)

        cpu_id = cpu.join(400)
        fields = job_fields(slurm_env, cpu_id)
        assert fields["JobState"] == "COMPLETED", fields
        assert "accuracy check passed" in cpu.text(), cpu.text()

        requeue_id = requeue.join(400)
        fields = job_fields(slurm_env, requeue_id)
        text = requeue.text()
        assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", (fields, text)
        # in this order: signal, training stopped, requeued, run 2 resumed and passed
        order = ["got USR1", "training stopped (exit", "requeueing job",
                 "run 2 (requeued 1 times)",
                 f"resumed from {tmp_path / 'requeue' / 'out' / 'checkpoints'}",
                 "accuracy check passed"]
        found = [text.find(line) for line in order]
        assert -1 not in found and found == sorted(found), (dict(zip(order, found)), text)
        print(f"\ncpu job {cpu.seconds:.0f} s, requeued job {requeue.seconds:.0f} s")
    finally:  # after a failure: no job left behind
        for sub in (cpu, requeue):
            if sub.thread.is_alive():
                _run(["scancel", f"--name={sub.name}"], slurm_env, check=False)
                sub.thread.join(60)
