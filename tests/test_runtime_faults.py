"""The distributed runtime's faults from the new-features probe (spawn,
``python -m spmdnet.run``, point-to-point waits, DataLoader workers, the
launcher's files): each case runs a real job from a serial test with a
deadline, and checks what PyTorch does in the same case (exception type,
fields, message) or that nothing hangs and no process is left behind."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from spmdnet import launch
from tests.helpers.launch import run_mpi

SPAWN = textwrap.dedent('''
    import os, sys, time
    import spmdnet.distributed as dist
    import spmdnet.multiprocessing as mp

    def work(rank, out, mode):
        dist.init_process_group("gloo")
        with open(os.path.join(out, f"pid{rank}"), "w") as f:
            f.write(str(os.getpid()))
        if rank == 1:
            if mode == "exit0":
                sys.exit(0)
            if mode == "exit3":
                sys.exit(3)
            if mode == "sigkill":
                os.kill(os.getpid(), 9)
        if mode == "orphan":
            time.sleep(300)
        time.sleep(2 if mode == "exit0" else 120)
        open(os.path.join(out, f"finished{rank}"), "w").close()

    if __name__ == "__main__":
        out, mode = sys.argv[1], sys.argv[2]
        try:
            mp.spawn(work, args=(out, mode), nprocs=2)
        except mp.ProcessExitedException as e:
            print("EXITED", type(e).__mro__[1].__name__, e.error_index, e.exit_code,
                  e.signal_name, e.pid > 0, str(e))
            sys.exit(0)
        print("JOINED")
''')


def _spawn(tmp_path, mode, timeout=90):
    script = tmp_path / "job.py"
    script.write_text(SPAWN)
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(tmp_path), mode],
                          capture_output=True, text=True, timeout=timeout,
                          env=launch.job_env())
    return done, time.monotonic() - start


def test_spawn_child_exiting_zero_early_is_a_success(tmp_path):
    # PyTorch: a child's exit code 0 is success; its siblings finish their work
    done, _ = _spawn(tmp_path, "exit0")
    assert done.returncode == 0 and "JOINED" in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "finished0").exists()


def test_spawn_reports_the_childs_exit_code(tmp_path):
    done, seconds = _spawn(tmp_path, "exit3")
    assert ("EXITED ProcessException 1 3 None True process 1 terminated with exit code 3"
            in done.stdout), done.stdout + done.stderr
    assert seconds < 90


def test_spawn_reports_a_signal_as_pytorch_does(tmp_path):
    done, seconds = _spawn(tmp_path, "sigkill")
    assert ("EXITED ProcessException 1 -9 SIGKILL True process 1 terminated with signal "
            "SIGKILL") in done.stdout, done.stdout + done.stderr
    assert seconds < 90


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def _children(pid):
    """Every descendant pid of ``pid`` (from /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents.setdefault(int(f.read().split(") ")[-1].split()[1]), []).append(
                        int(entry))
            except OSError:
                continue
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def test_sigkilled_spawn_parent_leaves_no_process(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SPAWN)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), "orphan"],
                            env=launch.job_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    family = []
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        time.sleep(0.3)
        family = _children(proc.pid)  # mpiexec, its proxy, the ranks and their supervisors
        assert len(family) >= 4, family
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in family if _alive(p)]
    finally:  # never leave the job behind, whatever failed
        proc.kill()
        for p in family:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def _job(tmp_path, source, n=2, timeout=90, env=None, args=()):
    script = tmp_path / "mpijob.py"
    script.write_text(textwrap.dedent(source))
    return run_mpi(n, script, *args, timeout=timeout, env=env)


def test_irecv_wait_timeout_raises_as_pytorch(tmp_path):
    # PyTorch (gloo): RuntimeError "Timed out waiting 1000ms for recv operation to complete"
    code, out, err, seconds = _job(tmp_path, """
        import datetime, time
        import spmdnet as torch
        import spmdnet.distributed as dist
        dist.init_process_group("gloo")
        t = torch.zeros(3)
        if dist.get_rank() == 0:
            work = dist.irecv(t, src=1)
            start = time.monotonic()
            try:
                work.wait(timeout=datetime.timedelta(seconds=1))
            except RuntimeError as e:
                print("RAISED", round(time.monotonic() - start), work.is_completed(), e,
                      flush=True)
        dist.barrier()
        if dist.get_rank() == 1:
            dist.send(torch.ones(3), dst=0)
        else:
            work.wait()
            print("GOT", t.tolist(), flush=True)
    """)
    assert code == 0 and seconds < 60, err
    assert "RAISED 1 False Timed out waiting 1000ms for recv operation to complete" in out, out
    assert "GOT [1.0, 1.0, 1.0]" in out


LOADER = textwrap.dedent('''
    import multiprocessing, os, signal, sys
    import numpy as np
    from spmdnet.utils.data import DataLoader, Dataset

    class Big(Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return np.full(1 << 20, i, dtype=np.float32)  # 4 MiB: a batch fills any pipe

    if __name__ == "__main__":
        it = iter(DataLoader(Big(), batch_size=4, num_workers=2, prefetch_factor=4))
        next(it)
        with open(sys.argv[1], "w") as f:
            f.write(" ".join(str(p.pid) for p in multiprocessing.active_children()))
        os.kill(os.getpid(), signal.SIGKILL)
''')


def test_loader_workers_end_when_their_process_is_sigkilled(tmp_path):
    script, pids = tmp_path / "loader.py", tmp_path / "pids"
    script.write_text(LOADER)
    with open(tmp_path / "err", "w") as err:  # not a pipe: a live worker would hold it open
        done = subprocess.run([sys.executable, str(script), str(pids)], stdout=err,
                              stderr=err, timeout=120, env=launch.job_env())
    assert done.returncode == -signal.SIGKILL, (tmp_path / "err").read_text()
    workers = [int(p) for p in pids.read_text().split()]
    assert len(workers) == 2
    deadline = time.monotonic() + 10  # PyTorch's workers check every 5 s
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in workers if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, "loader workers still blocked after their process died"


def test_rank_failing_before_init_ends_the_spmdnet_run_job(tmp_path):
    # torchrun ends the job in ~4 s with the rank's traceback; mpiexec alone waits for ever.
    # The rank fails before it imports spmdnet: the rank's supervisor sees it
    script = tmp_path / "early.py"
    script.write_text(textwrap.dedent('''
        import os
        if os.environ["PMI_RANK"] == "1":
            raise ValueError("rank one fails before init")
        import spmdnet.distributed as dist
        dist.init_process_group("gloo")
        dist.barrier()
    '''))
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "spmdnet.run", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, timeout=90,
                          env=launch.job_env())
    assert done.returncode == 1, done.stderr
    assert "ValueError: rank one fails before init" in done.stderr
    assert "spmdnet.run: rank 1 failed (exit code 1); the other ranks were ended" in done.stderr
    assert time.monotonic() - start < 60


def test_aborted_job_leaves_no_topology_file():
    # Hydra's /tmp/hydra_hwloc_xmlfile_* outlives a job ended by MPI_Abort
    before = set(launch.stale_topology_files())
    done = launch.run(2, "-c", "from mpi4py import MPI; MPI.COMM_WORLD.Abort(3)", timeout=60)
    assert done.returncode != 0
    assert not set(launch.stale_topology_files()) - before


def test_only_topology_files_nobody_holds_are_stale(tmp_path):
    held, stale = tmp_path / "hydra_hwloc_xmlfile_a", tmp_path / "hydra_hwloc_xmlfile_b"
    stale.write_text("<topology/>")
    with open(held, "w"):
        assert launch.stale_topology_files(tmp_path) == [stale]
        assert launch.clean_topology_files(tmp_path) == [stale]
    assert held.exists() and not stale.exists()


def test_unmatched_small_send_is_reported_with_a_nonzero_exit(tmp_path):
    code, out, err, seconds = _job(tmp_path, """
        import spmdnet as torch
        import spmdnet.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            dist.send(torch.ones(3), dst=1, tag=5)   # rank 1 never receives it
            t = torch.zeros(2)
            dist.send(t, dst=1, tag=6)               # this one is received
        else:
            got = torch.zeros(2)
            dist.recv(got, src=0, tag=6)
        dist.destroy_process_group()
    """)
    assert code != 0 and seconds < 60, (code, err)
    assert ("[rank 0] spmdnet: dist.send to rank 1 (tag 5, 3 float32 values, shape (3,)) "
            "was never received") in err, err
    assert "tag 6" not in err


def test_head_to_head_small_sends_still_complete(tmp_path):
    # buffered, as PyTorch's gloo: both ranks send first, then receive
    code, out, err, _ = _job(tmp_path, """
        import spmdnet as torch
        import spmdnet.distributed as dist
        dist.init_process_group("gloo")
        me, other = dist.get_rank(), 1 - dist.get_rank()
        dist.send(torch.full((4,), float(me)), dst=other)
        got = torch.zeros(4)
        dist.recv(got, src=other)
        print(f"GOT {me} {got.tolist()}", flush=True)  # one string: two ranks share the pipe
    """)
    assert code == 0, err
    assert "GOT 0 [1.0, 1.0, 1.0, 1.0]" in out and "GOT 1 [0.0, 0.0, 0.0, 0.0]" in out


MISMATCH = """
    import datetime, sys
    import spmdnet as torch
    import spmdnet.distributed as dist
    kind, timeout = sys.argv[1], sys.argv[2] == "timeout"
    dist.init_process_group("gloo", **({"timeout": datetime.timedelta(seconds=20)}
                                       if timeout else {}))
    r = dist.get_rank()
    for step in range(3):  # agreed once, then remembered
        dist.all_reduce(torch.ones(4))
    if kind == "dtype":
        t = torch.ones(4, dtype=torch.float32 if r == 0 else torch.int32)
    else:
        t = torch.ones(4 if r == 0 else 5)
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        print(f"RAISED {r} {type(e).__name__}: {e}", flush=True)
"""


@pytest.mark.parametrize("kind, timeout", [("dtype", ""), ("shape", ""),
                                           ("shape", "timeout")])
def test_all_reduce_mismatch_names_both_ranks(tmp_path, kind, timeout):
    # PyTorch (gloo) reduces float32 with int32 into garbage and exits 0
    code, out, err, seconds = _job(tmp_path, MISMATCH, args=[kind, timeout or "none"])
    assert seconds < 60, err
    want = ("rank 0: allreduce(sum) of float32 shape (4,); rank 1: allreduce(sum) of "
            + ("int32 shape (4,)" if kind == "dtype" else "float32 shape (5,)"))
    for r in (0, 1):
        assert f"RAISED {r} DistributedError: allreduce: the ranks of the communicator " \
               "disagree" in out, out + err
    assert out.replace(" (this rank)", "").count(want) == 2, out


def test_rank_failing_before_init_ends_a_plain_mpiexec_job(tmp_path):
    # `mpirun -n 2 python script.py`: the failing rank starts MPI only to abort the job
    code, out, err, seconds = _job(tmp_path, """
        import os, time
        import spmdnet.distributed as dist
        if os.environ["RANK"] == "1":
            time.sleep(0.5)  # rank 0 waits in MPI start-up by now
            raise ValueError("rank one fails before init")
        dist.init_process_group("gloo")
        dist.barrier()
        print("unreachable", flush=True)
    """, timeout=120)
    assert code != 0 and seconds < 60, (code, seconds, err)
    assert "ValueError: rank one fails before init" in err
    assert "[rank 1] spmdnet: this rank failed before MPI started; ending the job" in err
    assert "unreachable" not in out
