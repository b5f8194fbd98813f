"""MPI test harness: one rank's failure ends the whole run at once.

A failed assertion on one rank would otherwise leave the other ranks waiting
in the next collective until the timeout. The report is printed, tagged
with the rank, before ``COMM_WORLD.Abort``.
"""
import sys
import tempfile

import pytest

from spmdnet import dist


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """A private temporary base per rank: ranks started together would
    otherwise race for the same numbered pytest-N directory (and share it).
    Tests that need one directory for all ranks create it on rank 0 and
    broadcast its path."""
    if config.option.basetemp is None and config.getoption("with_mpi", False):
        from mpi4py import MPI  # noqa: PLC0415 - serial runs (no --with-mpi) start no MPI
        rank = MPI.COMM_WORLD.Get_rank()
        config.option.basetemp = tempfile.mkdtemp(prefix=f"spmdnet-pytest-rank{rank}-")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    from mpi4py import MPI  # noqa: PLC0415 - only after a failure: plain runs start no MPI
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


@pytest.fixture
def world_float64(float64):
    """MPI initialised and float64 as the default dtype for one test (the
    ``float64`` fixture of tests/conftest.py)."""
    dist.init()
