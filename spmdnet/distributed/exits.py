"""A rank that leaves the program never strands the others.

Without this, a rank that calls ``sys.exit(...)`` (or simply reaches the end
of the script) while the others still run collectives leaves them waiting
forever: ``SystemExit`` never reaches the abort hook.

``install`` (called by ``dist.init``) makes every rank, when it leaves
(Python's exit, or ``MPI.Finalize`` called by the program, as
``finalize_and_exit`` does), tell the others its exit status and wait in a
non-blocking barrier on a private duplicate of the world for every rank to
reach its own exit, for at most ``SPMDNET_EXIT_TIMEOUT_S`` (default 30 s;
``0`` turns the wait off):
- every rank arrives: the job ends normally, each rank with its own status
  (after the agreed stop on a signal every rank exits 3, the job's status);
- some do not: the job is aborted with the status of the rank that left (1
  for status 0; after an error exit as soon as a running rank is seen
  waiting in a collective, when the watchdog runs), naming that rank, its
  status or ``sys.exit`` message, and the ranks still running with what
  they are doing (when their watchdog answers).
Then a small ``dist.send`` that no rank received is reported and the rank
exits with code 1 (``sends``). A rank doing more than the timeout of work
alone after another rank has left the program (a long rank-0-only
epilogue) is taken for a hang: raise the knob for such programs.
"""
import atexit
import os
import sys
import time

from . import sends, watchdog
from ._mpi import mpi
from .abort import abort_job

EXIT = 7020
LOOK_S = 1.0  # after an error exit, how often to ask the running ranks what they do
UNKNOWN = object()   # the program ended or raised SystemExit itself
_state = {"comm": None, "timeout": 0.0, "status": UNKNOWN, "done": False}


def _recording_exit(status=None):
    """``sys.exit`` that remembers its argument for the exit report."""
    _state["status"] = status
    _state["exit"](status)


def describe(status):
    if status is UNKNOWN:
        return "left the program (end of the script, or SystemExit)"
    if status is None or status == 0:
        return "left the program with exit code 0"
    if isinstance(status, int):
        return f"left the program with exit code {status}"
    return f"left the program by sys.exit({status!r}) (exit code 1)"


def error_exit(status):
    return status is not UNKNOWN and status is not None and status != 0


def abort_code(status):
    return status if isinstance(status, int) and status else 1


def install(comm, timeout_s):
    """Run ``leave`` when this process leaves (idempotent); ``comm``: a
    private Dup of the world; ``timeout_s``: the wait, 0 for none."""
    _state["timeout"] = timeout_s
    if _state["comm"] is not None:
        return
    MPI = mpi()
    _state["comm"] = comm
    _state["exit"] = sys.exit
    sys.exit = _recording_exit
    atexit.register(leave)
    # MPI_Finalize deletes COMM_SELF's attributes first: a program that
    # finalizes MPI itself (finalize_and_exit) passes through ``leave`` too.
    keyval = MPI.Comm.Create_keyval(delete_fn=lambda *args: leave())
    MPI.COMM_SELF.Set_attr(keyval, True)


def leave():
    """Wait (bounded) for every rank to reach its exit, or abort the job; then
    stop the watchdog so that nothing calls MPI after MPI_Finalize."""
    if _state["done"]:
        return
    _state["done"] = True
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    comm, timeout = _state["comm"], _state["timeout"]
    if comm.Get_size() > 1 and timeout:
        _wait_for_everyone(MPI, comm, timeout)
        lost = sends.unmatched()
        comm.Barrier()  # every rank has judged its sends before any finalizes (which may
        # acknowledge a synchronous send that nobody received)
        if sends.report_unmatched(comm.Get_rank(), lost):
            watchdog.stop()
            sys.stdout.flush()
            os._exit(1)  # the exit code says so; the others have reached their exit
    watchdog.stop()


def _wait_for_everyone(MPI, comm, timeout):
    rank, size = comm.Get_rank(), comm.Get_size()
    status = _state["status"]
    what = describe(status)
    watchdog.mark_exited(what)
    sends = [comm.isend(what, dest=r, tag=EXIT) for r in range(size) if r != rank]
    barrier = comm.Ibarrier()
    start = time.time()
    arrived, next_look = {rank}, start + LOOK_S
    while not barrier.Test():
        _collect(MPI, comm, arrived)
        running = sorted(set(range(size)) - arrived)
        if time.time() > start + timeout:
            _abort(comm, what, running, f"waited {timeout:g} s "
                   "(SPMDNET_EXIT_TIMEOUT_S) for them to reach their exit", status)
        if error_exit(status) and watchdog.running() and time.time() > next_look:
            # an error exit: abort at once if a running rank waits in a collective
            states, next_look = watchdog.query(comm, running, LOOK_S), time.time() + LOOK_S
            if any(st.get("pending") for st in states.values()):
                _abort(comm, what, running, "they wait in collectives", status, states)
        time.sleep(0.005)
    for _ in range(size - len(arrived)):  # every rank has sent its notice by now
        comm.recv(source=MPI.ANY_SOURCE, tag=EXIT)
    MPI.Request.Waitall(sends)


def _collect(MPI, comm, arrived):
    status = MPI.Status()
    while comm.Iprobe(source=MPI.ANY_SOURCE, tag=EXIT, status=status):
        comm.recv(source=status.Get_source(), tag=EXIT)
        arrived.add(status.Get_source())


def _abort(comm, what, running, why, status, states=None):
    if states is None:
        states = watchdog.query(comm, running) if watchdog.running() else {}
    lines = [f"{what}, but ranks {running} are still running; {why}: aborting the job"]
    lines += [watchdog.describe_state(r, states[r]) if r in states else
              f"rank {r}: no answer" for r in running]
    abort_job(lines, abort_code(status))
