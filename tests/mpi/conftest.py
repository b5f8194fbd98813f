"""MPI test harness: one rank's failure ends the whole run at once.

A failed assertion on one rank would otherwise leave the other ranks waiting
in the next collective until the timeout. The report is printed, tagged
with the rank, before ``COMM_WORLD.Abort``.
"""
import sys

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.Get_size() == 1:
        return
    rank = comm.Get_rank()
    text = str(report.longrepr)
    sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in
                             [f"FAILED {item.nodeid} ({report.when})"] + text.splitlines()))
    sys.stderr.write(f"[rank {rank}] aborting all {comm.Get_size()} ranks\n")
    sys.stderr.flush()
    comm.Abort(1)
