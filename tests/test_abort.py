"""One rank's exception ends the whole MPI job within seconds, rank named."""
import subprocess
import sys
import textwrap

from tests.helpers.launch import ROOT, run_mpi

RAISE_ON_RANK_1 = textwrap.dedent("""
    import time
    import numpy as np
    from spmdnet import dist
    dist.init()
    if dist.rank() == 1:
        time.sleep(0.5)  # the others are inside the allreduce by now
        raise ValueError("boom on purpose")
    dist.allreduce(np.ones(4))  # never completes: rank 1 does not join
    print("unreachable", flush=True)
""")


def test_exception_on_one_rank_aborts_the_job(tmp_path):
    script = tmp_path / "raise_on_rank_1.py"
    script.write_text(RAISE_ON_RANK_1)
    code, out, err, seconds = run_mpi(3, script, timeout=60)
    assert code != 0
    assert seconds < 30, f"abort took {seconds:.1f} s"
    assert "[rank 1] ValueError: boom on purpose" in err
    assert "[rank 1] Traceback (most recent call last):" in err
    assert "unreachable" not in out


def test_single_process_exception_is_tagged_and_exits_nonzero(tmp_path):
    script = tmp_path / "raise_alone.py"
    script.write_text("from spmdnet import dist\ndist.init()\nraise KeyError('alone')\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 1
    assert "[rank 0] KeyError: 'alone'" in proc.stderr


def test_abort_hook_can_be_turned_off(tmp_path):
    script = tmp_path / "no_hook.py"
    script.write_text("import sys\nfrom spmdnet import dist\nbefore = sys.excepthook\n"
                      "dist.init()\nprint(sys.excepthook is before)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={"SPMDNET_ABORT_ON_ERROR": "0",
                                                      "PATH": "/usr/bin:/bin"})
    assert proc.stdout.strip() == "True", proc.stderr
