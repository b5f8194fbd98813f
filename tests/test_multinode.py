"""Two nodes on one machine: MPI over TCP between two network namespaces.

Each host is a network namespace with its own hostname and one end of a private
veth link (tests/helpers/netns.py); ``mpiexec`` runs on host a and starts host
b's ranks through hydra's ssh launcher pointed at tests/helpers/netns_launcher.sh.
MPICH's OFI netmod on libfabric's tcp provider carries the data over the link
(the byte counters of the link prove it), shared memory within a host. The tests:
every collective of spmdnet.distributed and torch.distributed's spelling, and the
DDP example, give one host's numbers; the link's alpha-beta fit and the share of
DDP's allreduce hidden behind backward (printed; -s shows them); a host lost
mid-training (all its processes killed, or its link cut) ends the job on the
surviving host, the last checkpoint is intact and the job resumes from it on two
hosts, or on the surviving host alone at half the world size and the same global
batch (the checkpoint resharded). And a two-node Slurm (slurmctld, one slurmd per
host; tests/helpers/netns_slurm.py) runs jobs/train_mlp_multinode.sbatch with its
ranks on both hosts, and ends an srun step whose host b died entirely (also marked
`slurm`).

Skipped, with the reason, where namespaces cannot be made (not root, no `ip`).
"""
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import netns
from tests.helpers.launch import ROOT, mpiexec, run_mpi
from tests.helpers.netns_slurm import TwoNodeSlurm

from spmdnet import launch
from spmdnet.distributed import watchdog
from spmdnet.distributed.slurm import clean_stale_mpich_segments

pytestmark = pytest.mark.multinode
COLLECTIVES = ROOT / "tests" / "helpers" / "multinode_collectives.py"
BIG_BYTES = 4 * 2**20  # the large allreduce of multinode_collectives.py
WATCHDOG_S, WATCHDOG_ABORT_S = 2, 5  # the lost-node tests' watchdog


@pytest.fixture(scope="module")
def hosts():
    why = netns.unavailable()
    if why:
        pytest.skip(f"two hosts cannot be made here: {why}")
    netns.clean_stale()
    two = netns.TwoHosts("t").up()
    try:
        yield two
    finally:
        two.down()
        clean_stale_mpich_segments()


def job_env(hosts, **extra):
    return hosts.env(launch.job_env(**{k: str(v) for k, v in extra.items()}))


def on_two_hosts(hosts, per_host, argv, timeout=120, **env):
    """Run ``argv`` with ``per_host`` ranks on each host; (rc, out, err, seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.run(hosts.mpiexec_argv(mpiexec(), per_host, argv), capture_output=True,
                          text=True, env=job_env(hosts, **env), timeout=timeout, cwd=ROOT)
    return proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - t0


def expected_collectives(p):
    """The closed form of every result of multinode_collectives.py on p ranks."""
    def v(r, n=12):
        return np.arange(n, dtype=np.float64) * (r + 1) + r
    every = np.stack([v(r) for r in range(p)])
    small = np.stack([v(r, 3) for r in range(p)])
    same = {"allreduce_sum": every.sum(0), "allreduce_mean": every.sum(0) / p,
            "allreduce_max": every.max(0), "allreduce_min": every.min(0),
            "allreduce_tensor": every.sum(0), "allreduce_scalar": [p * (p + 1) / 2],
            "allreduce_large_first_last": [p * (p + 1) / 2] * 2,
            "broadcast": v(p - 1), "broadcast_object": [p - 1],
            "allgather": small.ravel(), "c10d_all_reduce": every.sum(0),
            "c10d_broadcast": v(p - 1), "c10d_all_gather": small.ravel()}
    out = {k: [np.asarray(x, np.float64).tolist()] * p for k, x in same.items()}
    out["reduce_scatter"] = [small.sum(0).tolist()] * p  # every row of the input is v(r, 3)
    out["c10d_reduce_scatter"] = [(small.sum(0) + p * r).tolist() for r in range(p)]
    out["c10d_send_recv"] = [v((r - 1) % p).tolist() for r in range(p)]
    return out


SERVER = """if 1:
    import socket, sys
    s = socket.create_server((sys.argv[1], 7917))
    s.settimeout(20)
    c, _ = s.accept()
    c.sendall(socket.gethostname().encode())
"""
CLIENT = """if 1:
    import socket, sys, time
    for _ in range(200):  # until the server listens
        try:
            c = socket.create_connection((sys.argv[1], 7917), timeout=5)
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    print(c.recv(100).decode())
"""


def test_two_hosts_have_their_own_names_and_a_private_link(hosts):
    names = [subprocess.run(hosts.argv(h, ["hostname"]), capture_output=True, text=True,
                            timeout=20, check=True).stdout.strip() for h in hosts.hosts]
    assert names == [hosts.a.hostname, hosts.b.hostname]
    # a TCP connection from a to b across the link; the root namespace has no such address
    server = subprocess.Popen(hosts.argv(hosts.b, [sys.executable, "-c", SERVER,
                                                   hosts.b.addr]), stdout=subprocess.PIPE)
    try:
        client = subprocess.run(hosts.argv(hosts.a, [sys.executable, "-c", CLIENT,
                                                     hosts.b.addr]),
                                capture_output=True, text=True, timeout=30)
        assert client.stdout.strip() == hosts.b.hostname, client.stderr
    finally:
        server.kill()
        server.wait(10)
    root_addrs = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True,
                                timeout=20).stdout
    assert netns.SUBNET not in root_addrs


@pytest.mark.parametrize("per_host", [1, 2])
def test_collectives_over_tcp_give_one_hosts_numbers(hosts, tmp_path, per_host):
    p = 2 * per_host
    before = hosts.link_bytes()
    code, out, err, _ = on_two_hosts(hosts, per_host, [sys.executable, COLLECTIVES,
                                                       tmp_path / "two.json", BIG_BYTES])
    assert code == 0, err
    crossed = hosts.link_bytes() - before
    code, _, err, _ = run_mpi(p, COLLECTIVES, str(tmp_path / "one.json"), str(BIG_BYTES))
    assert code == 0, err
    two, one = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("two", "one"))
    assert two["hosts"] == [hosts.a.hostname] * per_host + [hosts.b.hostname] * per_host
    assert len(set(one["hosts"])) == 1
    assert two["results"] == one["results"] == expected_collectives(p)
    # the large allreduce alone moves at least its size across the link, each way
    assert crossed > 2 * BIG_BYTES, crossed


def test_ddp_example_over_tcp_gives_one_hosts_numbers(hosts, tmp_path):
    args = [str(ROOT / "examples" / "train_ddp.py"), "--epochs", "1", "--data-dir",
            str(tmp_path / "data"), "--min-accuracy", "0.5"]  # 1 epoch: about 0.8
    code, two, err, _ = on_two_hosts(hosts, 2, [sys.executable, *args])
    assert code == 0, two + err
    code, one, err, _ = run_mpi(4, *args)
    assert code == 0, one + err
    lines = [line for line in two.splitlines() if line.startswith("epoch")]
    assert len(lines) == 1 and "accuracy check passed" in two
    assert lines == [line for line in one.splitlines() if line.startswith("epoch")]


# -- the link measured ------------------------------------------------------------------------
def bench(hosts, tmp_path, name, *args, two=True):
    out = tmp_path / re.sub(r"\W", "_", name)
    argv = ["-m", "spmdnet.bench", *args, "--no-png", "--out", str(out)]
    if two:
        code, text, err, _ = on_two_hosts(hosts, 1, [sys.executable, *argv], timeout=200)
    else:
        code, text, err, _ = run_mpi(2, *argv, timeout=200)
    assert code == 0, err
    return out, text


def alpha_beta(out):
    """(alpha, beta) of the plain MPI allreduce on the world, and its time at the
    largest size: {bytes: seconds}."""
    with open(out / "allreduce_fit.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["group"] == "world" and r["impl"] == "raw")
    with open(out / "allreduce.csv") as f:
        times = {int(r["bytes"]): float(r["time_s"]) for r in csv.DictReader(f)
                 if r["group"] == "world" and r["impl"] == "raw"}
    return float(row["alpha_s"]), float(row["beta_s_per_byte"]), times


def exposed_comm_s(out):
    with open(out / "step.csv") as f:
        return float(next(r for r in csv.DictReader(f) if r["rank"] == "mean")["comm_s"])


CAP = "1gbit"  # tc's spelling; a 1 Gb/s Ethernet: 125 MB/s each way
CAP_BYTES_PER_S = 125e6
SIZES = ["--max-bytes", "1M", "--reps", "5"]
# an MLP of 270 k parameters: 1.1 MB of gradients to average each step
STEP = ["step", "--hidden", "256", "256", "--global-batch", "64", "--steps", "10", "--warmup",
        "2"]


def measure_link(hosts, tmp_path, label, ddp=True):
    """The allreduce fit across the link and, with ``ddp``, DDP's exposed
    allreduce with and without overlap; prints them."""
    alpha, beta, times = alpha_beta(bench(hosts, tmp_path, f"{label}-ar", "allreduce",
                                          *SIZES)[0])
    n = max(times)
    print(f"\nallreduce, two hosts ({label}): alpha {alpha * 1e6:.1f} us, beta "
          f"{beta * 1e9:.3f} ns/B, {n / times[n] / 1e6:.0f} MB/s at {n >> 10} KB")
    assert alpha > 0 and beta > 0, (alpha, beta)
    if ddp:
        exposed = {mode: exposed_comm_s(bench(hosts, tmp_path, f"{label}-{mode}", *STEP,
                                              "--overlap", mode)[0])
                   for mode in ("none", "auto")}
        hidden = 1 - exposed["auto"] / exposed["none"]
        print(f"DDP step ({label}): exposed allreduce {exposed['none'] * 1e3:.2f} ms without "
              f"overlap, {exposed['auto'] * 1e3:.2f} ms with: {100 * hidden:.0f}% hidden")
        assert exposed["none"] > 0, exposed
    return times


def test_link_alpha_beta_and_ddp_overlap(hosts, tmp_path):
    """Prints the fits and the hidden share (pytest -s: noisy on a loaded machine);
    asserts what the link enforces: under a 1 Gb/s cap, no faster than 1 Gb/s. The DDP
    step runs on the capped link, where its allreduce is worth hiding (on the bare veth
    it is a few ms, lost in the noise), or on the bare link where no cap can be set."""
    alpha, beta, _ = alpha_beta(bench(hosts, tmp_path, "shm", "allreduce", *SIZES,
                                      two=False)[0])
    print(f"\nallreduce, one host (shared memory): alpha {alpha * 1e6:.1f} us, beta "
          f"{beta * 1e9:.3f} ns/B")
    why = hosts.cap_bandwidth(CAP)
    if why is not None:
        print(f"no bandwidth cap: {why}")
        measure_link(hosts, tmp_path, "veth")
        return
    try:
        times = measure_link(hosts, tmp_path, f"tbf {CAP}")
    finally:
        hosts.uncap()
    measure_link(hosts, tmp_path, "veth", ddp=False)
    # a 2-rank allreduce sends n bytes each way (halves exchanged twice)
    n = max(times)
    assert n / times[n] < 1.1 * CAP_BYTES_PER_S, (n, times[n])


# -- a node lost mid-run ----------------------------------------------------------------------
EPOCHS = 4  # a resumed run must keep the options it was started with


BATCH = 16  # per rank, at 2 ranks on each host: a global batch of 64


def train_argv(tmp_path, epochs=EPOCHS, batch=BATCH):
    return [sys.executable, str(ROOT / "examples" / "train_mlp.py"), "--epochs", str(epochs),
            "--data-dir", str(tmp_path / "data"), "--metrics", str(tmp_path / "metrics.jsonl"),
            "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "4",
            "--batch-size", str(batch), "--min-accuracy", "0.9"]  # 4 epochs reach 0.93


def checkpoints(directory):
    return sorted(p.name for p in Path(directory).glob("ckpt-*.h5"))


def newest_verified(directory):
    """spmdnet's own choice of checkpoint to resume from (checksums verified)."""
    proc = subprocess.run([sys.executable, "-c", "import sys, spmdnet; "
                           "print(spmdnet.latest_checkpoint(sys.argv[1]))", str(directory)],
                          capture_output=True, text=True, timeout=60,
                          env=launch.job_env())
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip()).name


def lose_host_mid_training(hosts, tmp_path, lose):
    """Train on 2x2 ranks, call ``lose`` once the second checkpoint exists;
    returns (rc, stderr, seconds from the loss to the job's end)."""
    env = job_env(hosts, SPMDNET_WATCHDOG_S=WATCHDOG_S, SPMDNET_WATCHDOG_ABORT_S=WATCHDOG_ABORT_S)
    job = subprocess.Popen(hosts.mpiexec_argv(mpiexec(), 2, train_argv(tmp_path)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           cwd=ROOT)
    try:
        deadline = time.monotonic() + 90
        while len(checkpoints(tmp_path / "ck")) < 2 and job.poll() is None:
            assert time.monotonic() < deadline, "no second checkpoint within 90 s"
            time.sleep(0.05)
        assert job.poll() is None, job.communicate()
        t0 = time.perf_counter()
        lose()
        _, err = job.communicate(timeout=WATCHDOG_ABORT_S + 30)
        seconds = time.perf_counter() - t0
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    # nothing of the job is left on the surviving host (bounded wait)
    for _ in range(100):
        left = netns.pids(hosts.a.netns)
        if not left:
            break
        time.sleep(0.05)
    assert not left, f"processes left on host a: {left}"
    print(f"\n{lose.__name__}: the job ended {seconds:.2f} s after it (exit {job.returncode})")
    return job.returncode, err, seconds


def resume_lost_job(hosts, tmp_path, alone=False):
    """Resume the lost job from its last checkpoint on both hosts, or with
    ``alone`` on host a alone: half the ranks, each with twice the batch."""
    last = checkpoints(tmp_path / "ck")[-1]
    assert newest_verified(tmp_path / "ck") == last  # the last checkpoint is intact
    if alone:
        t0 = time.perf_counter()
        proc = subprocess.run(
            hosts.mpiexec_argv_on(mpiexec(), hosts.a, 2, train_argv(tmp_path, batch=2 * BATCH)),
            capture_output=True, text=True, env=job_env(hosts), timeout=120, cwd=ROOT)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
        print(f"\nresumed on host a alone: {time.perf_counter() - t0:.1f} s")
        assert "2 ranks" in out and "global batch 64" in out, out + err
    else:
        code, out, err, _ = on_two_hosts(hosts, 2, train_argv(tmp_path))
        assert "4 ranks" in out and "global batch 64" in out, out + err
    assert code == 0, out + err
    step = int(re.search(r"ckpt-(\d+)", last).group(1))
    assert f"resumed from {tmp_path / 'ck'} at step {step}," in out, out
    assert "accuracy check passed" in out


@pytest.fixture(scope="module")
def killed_run(hosts, tmp_path_factory):
    """A 2x2-rank job whose host b was killed after its second checkpoint:
    (its directory, rc, stderr, seconds to its end); each test resumes a copy."""
    def kill_host_b():
        hosts.kill_host(hosts.b)
    run_dir = tmp_path_factory.mktemp("killed")
    return (run_dir, *lose_host_mid_training(hosts, run_dir, kill_host_b))


def copy_of(run_dir, tmp_path):
    shutil.copytree(run_dir, tmp_path / "run")
    return tmp_path / "run"


def test_host_killed_mid_training_ends_the_job_and_it_resumes(hosts, killed_run, tmp_path):
    run_dir, code, err, seconds = killed_run
    # hydra sees host b's proxy go and ends the job at once (its message names no rank)
    assert code != 0 and seconds < WATCHDOG_ABORT_S, (seconds, err)
    resume_lost_job(hosts, copy_of(run_dir, tmp_path))


def test_host_killed_mid_training_resumes_on_the_surviving_host_alone(hosts, killed_run,
                                                                      tmp_path):
    """Host b stays lost: the job continues on host a's two ranks from the
    checkpoint written by four, at the same global batch, and passes its check."""
    run_dir, code, _, _ = killed_run
    assert code != 0
    resume_lost_job(hosts, copy_of(run_dir, tmp_path), alone=True)


def test_link_down_mid_training_watchdog_names_the_lost_host_and_it_resumes(hosts, tmp_path):
    def cut_link_of_b():
        hosts.link_down(hosts.b)
    try:
        code, err, seconds = lose_host_mid_training(hosts, tmp_path, cut_link_of_b)
    finally:
        hosts.kill_host(hosts.b)  # its ranks wait forever for a peer they cannot reach
        hosts.link_up(hosts.b)
    assert code != 0 and seconds < WATCHDOG_ABORT_S + 10, (seconds, err)
    assert "watchdog (aborting the job)" in err, err
    assert f"ranks not in it: [2, 3] on host {hosts.b.hostname}" in err, err
    resume_lost_job(hosts, tmp_path)



# -- a two-node Slurm -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm(hosts, tmp_path_factory):
    cluster = TwoNodeSlurm(hosts, tmp_path_factory.mktemp("slurm"))
    why = cluster.install()
    if why:
        pytest.skip(f"Slurm cannot be started here: {why}")
    try:
        cluster.start(launch.job_env())
        yield cluster
    finally:
        cluster.stop()


def slurm_run(slurm, argv, env, timeout=30):
    proc = subprocess.run(slurm.cmd(slurm.hosts.a, argv), capture_output=True, text=True,
                          env=slurm.env(env), timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout


@pytest.mark.slurm
def test_multinode_sbatch_runs_on_both_slurm_nodes(hosts, slurm, tmp_path):
    """``sbatch --nodes=2 jobs/train_mlp_multinode.sbatch``, scaled to this machine
    from the command line (2 ranks of 1 CPU per node; the fake GPUs are not used)."""
    env = dict(job_env(hosts), OUT_DIR=str(tmp_path / "out"), DATA_DIR=str(tmp_path / "data"),
               EPOCHS=str(EPOCHS), TRAIN_ARGS="--min-accuracy 0.9")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
    output, before = tmp_path / "job.out", hosts.link_bytes()
    job = slurm_run(slurm, ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=2",
                            "--cpus-per-task=1", f"--output={output}",
                            ROOT / "jobs" / "train_mlp_multinode.sbatch"], env)
    job = job.strip().split(";")[0]
    state, deadline = "", time.monotonic() + 240
    try:
        while state not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            assert time.monotonic() < deadline, f"job {job} still {state} after 240 s"
            time.sleep(0.5)
            shown = slurm_run(slurm, ["scontrol", "show", "job", job], env)
            state = re.search(r"JobState=(\w+)", shown).group(1)
    finally:
        if state not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            slurm_run(slurm, ["scancel", job], env)
    text = output.read_text() if output.exists() else ""
    assert state == "COMPLETED", (state, text, slurm.logs())
    assert f"nodes: {hosts.a.hostname} {hosts.b.hostname}" in text, text
    placed = dict(re.findall(r"task (\d+) of 4 on (\S+)", text))
    assert placed == {"0": hosts.a.hostname, "1": hosts.a.hostname, "2": hosts.b.hostname,
                      "3": hosts.b.hostname}, text
    assert "4 ranks" in text and "accuracy check passed" in text, text
    # the gradients crossed the link: 88 steps x 2 x 108 KB of float32 (26 k parameters)
    crossed = hosts.link_bytes() - before
    print(f"\nthe two-node Slurm job moved {crossed / 1e6:.1f} MB over the link")
    assert crossed > 88 * 2 * 100e3, crossed


STALLER = """if 1:
    import sys, time
    import numpy as np
    from spmdnet import dist
    dist.init()
    for step in range(100000):
        dist.allreduce(np.ones(1000))
        if step == 20:
            open(f"{sys.argv[1]}/ready.{dist.rank()}", "w").close()
        time.sleep(0.01)
"""


@pytest.mark.slurm
def test_host_killed_under_srun_ends_the_step(hosts, slurm, tmp_path):
    """Host b's slurmd, slurmstepd and ranks killed: no launcher sees the ranks go, and
    the survivors' MPI calls stop returning (the network layer retries the lost peers);
    the watchdog's MPI-free deadline ends them, naming the hosts, and srun ends."""
    env = dict(job_env(hosts, SPMDNET_WATCHDOG_S=WATCHDOG_S,
                       SPMDNET_WATCHDOG_ABORT_S=WATCHDOG_ABORT_S))
    step = subprocess.Popen(slurm.cmd(hosts.a, [
        "srun", "--nodes=2", "--ntasks-per-node=2", "--mpi=pmi2", "--kill-on-bad-exit=1",
        sys.executable, "-m", "mpi4py", "-c", STALLER, tmp_path]), env=slurm.env(env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ready.*"))) < 4:
            assert step.poll() is None, step.communicate()
            assert time.monotonic() < deadline, "the ranks did not start within 60 s"
            time.sleep(0.05)
        t0 = time.perf_counter()
        hosts.kill_host(hosts.b)
        _, err = step.communicate(timeout=WATCHDOG_ABORT_S + 60)
        seconds = time.perf_counter() - t0
    finally:
        if step.poll() is None:
            step.kill()
            step.communicate()
        hosts.kill_host(hosts.b)
    print(f"\nhost b killed under srun: the step ended {seconds:.1f} s after it")
    assert step.returncode != 0, err
    assert "watchdog (aborting the job)" in err and "a peer process or its host is likely " \
                                                    "lost" in err, err
    assert f"ranks by host: {hosts.a.hostname}: [0, 1], {hosts.b.hostname}: [2, 3]" in err, err
    # the deadline (abort limit, then STUCK_S without an MPI call returning), then srun's wait
    assert seconds < WATCHDOG_ABORT_S + watchdog.STUCK_S + 20, (seconds, err)
