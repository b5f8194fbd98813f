"""spmdnet.multiprocessing.spawn both ways, python -m spmdnet.run, and
torchrun's environment under mpiexec (issue 24 items 2 and 4).

From plain python, spawn starts MPI ranks that import the script as
__mp_main__ (its __main__ block runs once, in the parent); under mpiexec it
runs fn on the existing ranks (the __main__ block runs on every rank).
Failures: a rank's exception -> ProcessRaisedException with its rank and
traceback, an abnormal exit -> ProcessExitedException, the other ranks
ended; SIGTERM to the parent reaches the ranks, which stop with the agreed
code 3, and the parent exits 3. Every job is bounded by a timeout."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from spmdnet import launch
from spmdnet.distributed import launcher_env
from spmdnet.multiprocessing.processes import ProcessContext, ProcessExitedException

SCRIPT = textwrap.dedent('''
    import os, sys, time
    import spmdnet as torch
    import spmdnet.distributed as dist
    import spmdnet.multiprocessing as mp

    def work(rank, world_size, out, mode):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        with open(os.path.join(out, f"rank{rank}"), "w") as f:
            f.write(f"{t.item()} {os.environ['RANK']} {os.environ['LOCAL_RANK']} {__name__}")
        if mode == "raise" and rank == 1:
            raise ValueError("rank one gives up")
        if mode == "exit" and rank == 1:
            os._exit(7)
        if mode in ("raise", "exit"):
            time.sleep(120)  # rank 0 would wait: the parent must end it
        if mode == "stop":
            stop = dist.StopSignal()
            open(os.path.join(out, f"ready{rank}"), "w").close()
            while not stop.should_stop():
                time.sleep(0.05)
            dist.finalize_and_exit(3)

    if __name__ == "__main__":
        out, mode = sys.argv[1], sys.argv[2]
        with open(os.path.join(out, f"main-{os.getpid()}"), "w") as f:
            f.write("main block")
        try:
            mp.spawn(work, args=(2, out, mode), nprocs=2)
        except mp.ProcessRaisedException as exc:
            print("RAISED", exc.error_index, "ValueError: rank one gives up" in str(exc))
            sys.exit(0)
        except mp.ProcessExitedException as exc:
            print("EXITED", exc.error_index in (0, 1), exc.exit_code)
            sys.exit(0)
        print("JOINED")
''')


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "course.py"
    path.write_text(SCRIPT)
    return path


def _ranks(out):
    return sorted((out / f"rank{r}").read_text() for r in range(2))


def _mains(out):
    return len(list(out.glob("main-*")))


def test_spawn_from_plain_python_runs_main_once(script, tmp_path):
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(tmp_path), "ok"],
                          capture_output=True, text=True, timeout=180, env=launch.job_env())
    assert done.returncode == 0, done.stderr
    assert "JOINED" in done.stdout and _mains(tmp_path) == 1
    assert _ranks(tmp_path) == ["3.0 0 0 __mp_main__", "3.0 1 1 __mp_main__"]
    assert time.monotonic() - start < 180


def test_spawn_under_mpiexec_runs_fn_on_every_rank(script, tmp_path):
    done = launch.run(2, script, tmp_path, "ok", timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("JOINED") == 2 and _mains(tmp_path) == 2  # SPMD: every rank
    assert _ranks(tmp_path) == ["3.0 0 0 __main__", "3.0 1 1 __main__"]


def test_spawn_size_mismatch_under_mpiexec_is_clear(tmp_path):
    code = ("import spmdnet.multiprocessing as mp\n"
            "try:\n    mp.spawn(print, nprocs=3)\n"
            "except Exception as e:\n"  # one string: two ranks share the pipe
            "    print(f'{type(e).__name__} {e}', flush=True)\n")
    done = launch.run(2, "-c", code, timeout=120)
    assert done.stdout.count("DistributedError spawn(nprocs=3) inside an MPI job of 2") == 2


# an abnormal exit names the rank seen dying first: after MPI starts, mpiexec kills the
# others at once, so only the exit code is certain
@pytest.mark.parametrize("mode, expected", [("raise", "RAISED 1 True"),
                                            ("exit", " 7\n")])
def test_a_failing_rank_ends_the_others_and_raises(script, tmp_path, mode, expected):
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(tmp_path), mode],
                          capture_output=True, text=True, timeout=100, env=launch.job_env())
    assert expected in done.stdout, done.stdout + done.stderr
    assert ("RAISED" if mode == "raise" else "EXITED True") in done.stdout
    assert time.monotonic() - start < 100  # rank 0's 120 s sleep was cut short


@pytest.mark.parametrize("rank0_status", [None, "signal 9"])
def test_exit_code_is_the_failing_ranks_when_the_job_ended_before_join_looked(tmp_path,
                                                                              rank0_status):
    """mpiexec may end the job (the others killed, its own code 9) before
    join() polls once: the exception still names the rank that failed and
    its own code, from the status its supervisor wrote, not mpiexec's 9."""
    folder = tmp_path / "spawn"
    folder.mkdir()
    for rank in (0, 1):
        (folder / f"started-{rank}").write_text(str(1000 + rank))
    (folder / "status-1").write_text("exit 7")
    if rank0_status is not None:  # killed after rank 1 exited: a later status
        time.sleep(0.05)
        (folder / "status-0").write_text(rank0_status)
    context = ProcessContext(None, str(folder), 2)
    with pytest.raises(ProcessExitedException) as failed:
        context._result(9)
    assert (failed.value.error_index, failed.value.exit_code, failed.value.pid) == (1, 7, 1001)


def test_sigterm_to_the_parent_stops_the_ranks_with_code_3(script, tmp_path):
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), "stop"],
                            env=launch.job_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 3, out + err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_spmdnet_run_starts_the_script_with_torchrun_variables(tmp_path):
    path = tmp_path / "show.py"
    # each rank writes its own file: two ranks printing to one pipe may interleave
    path.write_text("import os, sys\nimport spmdnet.distributed as dist\n"
                    "dist.init_process_group('nccl')\n"
                    "line = ' '.join(map(str, ['R', dist.get_rank(), os.environ['RANK'],"
                    " os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'],"
                    " os.environ['LOCAL_WORLD_SIZE'], sys.argv[1:]]))\n"
                    f"open(r'{tmp_path}/rank' + os.environ['RANK'], 'w').write(line)\n")
    done = subprocess.run([sys.executable, "-m", "spmdnet.run", "--nproc_per_node", "2",
                           "--standalone", str(path), "a", "--b", "3"], capture_output=True,
                          text=True, timeout=120, env=launch.job_env())
    assert done.returncode == 0, done.stderr
    lines = sorted((tmp_path / f"rank{r}").read_text() for r in (0, 1))
    assert lines == ["R 0 0 0 2 2 ['a', '--b', '3']", "R 1 1 1 2 2 ['a', '--b', '3']"]


def test_spmdnet_run_refuses_several_nodes():
    done = subprocess.run([sys.executable, "-m", "spmdnet.run", "--nnodes", "2", "x.py"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "one node only" in done.stderr


@pytest.mark.parametrize("env, expected", [
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
     {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
     {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "6", "SLURM_STEP_NUM_TASKS": "7",
      "SLURM_LOCALID": "2", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "4,3"},
     {"RANK": "6", "WORLD_SIZE": "7", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3"}),
    ({"SLURM_STEP_ID": "4294967294", "SLURM_PROCID": "0"}, {}),  # the batch script
    ({}, {}),  # plain python: nothing, as without torchrun
])
def test_torchrun_variables_from_each_launcher(monkeypatch, env, expected):
    monkeypatch.setattr(os, "environ", os.environ.copy())  # set_torchrun_env writes to it
    for key in list(os.environ):
        if key.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_", "MPI_LOCAL")) or \
                key in launch.TORCHRUN_ENV:
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert launcher_env.set_torchrun_env() == expected
    assert {k: os.environ[k] for k in expected} == expected


def test_torchrun_variables_already_set_are_kept(monkeypatch):
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()
                                        if k not in launch.TORCHRUN_ENV})
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    added = launcher_env.set_torchrun_env()
    assert "RANK" not in added and added["WORLD_SIZE"] == "2"
    assert "RANK" not in launch.job_env() and "WORLD_SIZE" not in launch.job_env()
