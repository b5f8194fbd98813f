"""No hang with the README's launch line (``mpirun -n N python script.py``):
a rank that leaves the program, ranks with different numbers of batches in
check mode, a rank stalled inside save_checkpoint. Each case launches its own
job from a serial test with a deadline, with the exit wait and the watchdog
limits shortened by their knobs."""
import textwrap

import pytest

from spmdnet import config
from spmdnet.distributed import guard
from spmdnet.distributed.watchdog import _reached
from tests.helpers.launch import run_mpi

QUICK = {"SPMDNET_EXIT_TIMEOUT_S": "2"}


def launch(tmp_path, source, n=3, env=None, args=()):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(source))
    return run_mpi(n, script, *args, timeout=60, env=env)


LEAVER = """
    import sys, time
    import numpy as np
    from spmdnet import dist
    dist.init()
    if dist.rank() == 1:
        time.sleep(0.3)  # the others are inside the allreduce by now
        sys.exit(eval(sys.argv[1]))
    dist.allreduce(np.ones(4))  # never completes: rank 1 has left
    print("unreachable", flush=True)
"""


def test_exit_zero_of_one_rank_ends_the_job_naming_it(tmp_path):
    code, out, err, seconds = launch(tmp_path, LEAVER, env=QUICK, args=["0"])
    assert code != 0 and seconds < 20, (code, seconds, err)
    assert ("[rank 1] left the program with exit code 0, but ranks [0, 2] are still "
            "running") in err
    assert "[rank 1] rank 0: waiting in allreduce(sum) #1" in err and "job.py:9" in err
    assert "unreachable" not in out


@pytest.mark.parametrize("status, code", [("'leaving on purpose'", 1), ("2", 2)])
def test_error_exit_of_one_rank_aborts_like_an_exception(tmp_path, status, code):
    # the default exit wait (30 s): an error exit aborts as soon as the others are
    # seen waiting in a collective
    got, out, err, seconds = launch(tmp_path, LEAVER, args=[status])
    assert got == code and seconds < 15, (got, seconds, err)
    assert f"[rank 1] left the program {'by sys.exit' if code == 1 else 'with'}" in err
    if code == 1:
        assert "sys.exit('leaving on purpose')" in err
    assert "they wait in collectives: aborting the job" in err


@pytest.mark.parametrize("how", ["sys.exit(3)", "dist.finalize_and_exit(3)"])
def test_every_rank_exiting_with_one_code_is_a_normal_end(tmp_path, how):
    code, out, err, seconds = launch(tmp_path, f"""
        import sys, time
        import numpy as np
        from spmdnet import dist
        dist.init()
        dist.allreduce(np.ones(4))
        if dist.rank() == 0:
            time.sleep(1.0)  # a late rank (saving a checkpoint, say) is no failure
        {how}
    """, env=QUICK)
    assert code == 3, err
    assert "abort" not in err.lower(), err


UNEVEN = """
    import numpy as np
    import spmdnet as sn
    import spmdnet.functional as F
    from spmdnet import dist, nn, optim, parallel
    dist.init()
    model = nn.Linear(4, 2)
    ddp = parallel.DataParallel(model)
    opt = optim.SGD(model.parameters(), lr=0.1)
    for step in range(2 if dist.rank() == 0 else 3):  # rank 0 has fewer batches
        loss = F.cross_entropy(ddp(sn.tensor(np.ones((2, 4), np.float32))), np.array([0, 1]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.allreduce(np.ones(1))  # "evaluate" on the world communicator
"""


def test_check_mode_reports_uneven_batches_across_communicators(tmp_path):
    code, out, err, seconds = launch(tmp_path, UNEVEN, n=2, env={
        "SPMDNET_DEBUG_COLLECTIVES": "1", **QUICK})
    assert code != 0 and seconds < 20, (code, seconds, err)
    assert "DistributedError: collective mismatch" in err
    assert "job.py:15" in err and "job.py:13" in err  # evaluate's and backward's sites
    assert "allreduce(gradient bucket 0)" in err


CKPT_STALL = """
    import sys, time
    import spmdnet as sn
    from spmdnet import checkpoint, dist, nn
    dist.init()
    model = nn.Linear(3, 2)
    if dist.rank() == 0:  # a hung file system: rank 0 never finishes writing
        checkpoint.writing._save_on_root = lambda *args: time.sleep(60)
    sn.save_checkpoint(sys.argv[1], model, step=1)
"""


def test_rank_stalled_in_save_checkpoint_is_reported_and_the_job_ends(tmp_path):
    code, out, err, seconds = launch(tmp_path, CKPT_STALL, args=[str(tmp_path / "ck") + "/"],
                                     env={"SPMDNET_WATCHDOG_S": "1",
                                          "SPMDNET_WATCHDOG_ABORT_S": "3"})
    assert code != 0 and seconds < 20, (code, seconds, err)
    assert "watchdog (stalled)" in err and "watchdog (aborting the job)" in err
    assert "ranks not in it: [0]" in err and "checkpoint" in err



GATHER_AHEAD = """
    import time
    import spmdnet as torch
    import spmdnet.distributed as dist
    dist.init_process_group("mpi")
    if dist.get_rank() == 2:
        time.sleep(60)  # busy in Python: its watchdog answers, "not in a collective"
    t = torch.ones(2)
    dist.gather(t, [torch.zeros(2) for _ in range(3)] if dist.get_rank() == 0 else None, dst=0)
    dist.broadcast(t, src=0)  # rank 1 is here while rank 0 still gathers
"""


def test_rank_gone_past_a_gather_is_not_named_late(tmp_path):
    """A gather's non-root ranks leave it before the root: rank 1 waits in the
    next broadcast while rank 0 still waits for rank 2. The report names only
    rank 2, the rank that has not reached the gather."""
    code, out, err, seconds = launch(tmp_path, GATHER_AHEAD,  # 2 s: rank 1 has moved on
                                     env={"SPMDNET_WATCHDOG_S": "2",
                                          "SPMDNET_WATCHDOG_ABORT_S": "4"})
    assert code != 0 and seconds < 30, (code, seconds, err)
    gather_report = [line for line in err.splitlines()
                     if line.startswith("[rank 0] watchdog") and "has waited" in line]
    assert gather_report and all("ranks not in it: [2]" in line for line in gather_report), err
    assert "rank 1: waiting in broadcast" in err, err


PRINT_THEN_RAISE = """
    import time
    import numpy as np
    from spmdnet import dist
    dist.init()
    if dist.rank() == 1:
        print("progress before the failure")  # block-buffered: stdout is a pipe
        raise ValueError("boom")
    dist.allreduce(np.ones(4))
"""


def test_abort_flushes_what_the_failing_rank_printed(tmp_path):
    code, out, err, _ = launch(tmp_path, PRINT_THEN_RAISE, env={"PYTHONUNBUFFERED": ""})
    assert code != 0
    assert "progress before the failure" in out
    assert "[rank 1] ValueError: boom" in err


def test_every_rank_raising_leaves_a_full_traceback(tmp_path):
    code, out, err, _ = launch(tmp_path, """
        from spmdnet import dist
        dist.init()
        raise RuntimeError(f"all fail {dist.rank()}")
    """, n=4)
    assert code != 0
    assert "Traceback (most recent call last):" in err and "RuntimeError: all fail" in err


# -- the knobs ----------------------------------------------------------------------
def test_watchdog_is_on_by_default_with_pytorchs_timeout(monkeypatch):
    monkeypatch.delenv("SPMDNET_WATCHDOG_S", raising=False)
    monkeypatch.delenv("SPMDNET_WATCHDOG_ABORT_S", raising=False)
    try:
        assert guard.configure() == 300
        assert guard.settings()["abort_s"] == 600
        monkeypatch.setenv("SPMDNET_WATCHDOG_S", "0")
        assert guard.configure() is None
    finally:
        monkeypatch.undo()
        guard.configure()


@pytest.mark.parametrize("name", ["SPMDNET_WATCHDOG_S", "SPMDNET_WATCHDOG_ABORT_S",
                                  "SPMDNET_EXIT_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["abc", "-5", "nan"])
def test_bad_seconds_raise_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name}='{value}': expected a number of seconds"):
        config.get_seconds(name, 1.0)
    if name != "SPMDNET_EXIT_TIMEOUT_S":  # the exit wait is read by dist.init, not the guard
        with pytest.raises(ValueError, match=f"{name}='{value}': expected a number of seconds"):
            guard.configure()


def test_bad_watchdog_value_fails_dist_init_naming_it(tmp_path):
    code, out, err, _ = launch(tmp_path, "from spmdnet import dist\ndist.init()\n", n=2,
                               env={"SPMDNET_WATCHDOG_S": "abc"})
    assert code != 0 and "SPMDNET_WATCHDOG_S='abc'" in err


def test_a_later_number_on_a_same_named_communicator_of_other_ranks_is_not_past():
    """Unnamed communicators share a label ("comm(size 2)" for every pair of a
    mesh), each with its own numbers: a rank stuck at #40 of its tensor-parallel
    pair has not gone past #7 of the data-parallel pair that waits for it."""
    stalled = {"op": "allreduce", "seq": 7, "comm": "comm(size 2)", "members": (0, 2)}
    other_pair = {"op": "allreduce", "seq": 40, "comm": "comm(size 2)", "members": (2, 3)}
    same_pair = dict(other_pair, members=(0, 2))
    assert not _reached({"pending": other_pair, "last": None}, stalled)
    assert _reached({"pending": same_pair, "last": None}, stalled)
    assert _reached({"pending": None, "last": dict(same_pair, seq=7)}, stalled)
    assert not _reached({"pending": None, "last": dict(same_pair, seq=6)}, stalled)
    assert not _reached({"pending": same_pair, "last": None}, dict(stalled, members=None))
