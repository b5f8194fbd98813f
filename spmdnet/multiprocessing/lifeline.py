"""Processes that end when the process they work for dies, and the small
supervisor that mpiexec starts for each rank of ``spawn`` and ``python -m
spmdnet.run``.

``watch(pid, on_death)`` runs ``on_death()`` in a daemon thread as soon as
process ``pid`` has ended, waiting on a Linux pidfd (no polling, no pid
reuse), else polling every ``POLL_S``. ``die_with_parent(sig)`` asks the
kernel to send ``sig`` to this process when its parent dies (Linux's
``PR_SET_PDEATHSIG``; PyTorch's spawned children do the same). Both are
used by ``spawn``'s ranks and the DataLoader's workers: a SIGKILLed parent
runs no clean-up of its own, so its children must notice by themselves.

``supervise(folder, rank, parent_pid, start)`` forks the rank (``start()``
runs in the child, which dies with its supervisor), forwards the launcher's
signals to it, ends it when ``parent_pid`` dies, waits for it and notes how
it ended in ``folder/status-<rank>`` ("exit N" or "signal N", as
``os.waitpid`` tells; a note the rank wrote itself is kept), then ends the
same way, so that mpiexec sees what the rank did. The job's parent reads
the notes: the rank's own exit code or signal, at once, even when the rank
failed before MPI started (mpiexec itself would wait for it for ever).

Run as a script (stdlib only, so that it starts fast and imports nothing of
spmdnet): ``python lifeline.py <folder> <parent pid> <program> [args]``
supervises ``program`` (exec'd in the child) as the rank of ``PMI_RANK``.
"""
import ctypes
import os
import select
import signal
import sys
import threading
import time

POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_for_death(pid, fd):
    if fd is not None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():
            pass
        os.close(fd)
        return
    while _alive(pid):
        time.sleep(POLL_S)


def watch(pid, on_death, name="spmdnet-lifeline"):
    """Call ``on_death()`` (in a daemon thread) once process ``pid`` has
    ended; at once when it is gone already. Returns the thread."""
    try:
        fd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    except ProcessLookupError:
        fd, pid = None, None
    except OSError:  # an old kernel: poll instead
        fd = None

    def run():
        if pid is not None:
            _wait_for_death(pid, fd)
        on_death()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def die_with_parent(sig=signal.SIGKILL):
    """Have the kernel send ``sig`` to this process when its parent dies
    (Linux only; elsewhere a no-op returning False). Returns True when set
    and the parent was still alive after setting it."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)
    return True


FORWARDED = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")
PARENT_GONE_GRACE_S = 2.0  # SIGTERM first (a rank may stop cleanly), then SIGKILL


def note(folder, name, content):
    """Write ``content`` to ``folder/name`` atomically (the parent polls the folder)."""
    tmp = os.path.join(folder, f".{name}.tmp")
    with open(tmp, "wb" if isinstance(content, bytes) else "w") as f:
        f.write(content)
    os.replace(tmp, os.path.join(folder, name))


def read_statuses(folder):
    """{rank: ("exit", code) or ("signal", number)} noted in ``folder``."""
    found = {}
    for name in os.listdir(folder):
        head, _, rank = name.partition("-")
        if head == "status" and rank.isdigit():
            with open(os.path.join(folder, name)) as f:
                kind, _, value = f.read().partition(" ")
            found[int(rank)] = (kind, int(value))
    return found


def _status(wait_status):
    if os.WIFSIGNALED(wait_status):
        return "signal", os.WTERMSIG(wait_status)
    return "exit", os.waitstatus_to_exitcode(wait_status)


def _end_like(kind, value):
    """Leave this supervisor the way its rank left (the launcher sees it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if kind == "signal":
        signal.signal(value, signal.SIG_DFL)
        os.kill(os.getpid(), value)
        time.sleep(1.0)  # a signal that does not end a process: exit instead
        os._exit(128 + value)
    os._exit(value)


def supervise(folder, rank, parent_pid, start):
    """Fork the rank, which runs ``start()``; never returns in the supervisor
    (see the module docstring)."""
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        die_with_parent(signal.SIGKILL)
        start()
        return

    def forward(signum, frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for name in FORWARDED:
        signal.signal(getattr(signal, name), forward)

    def parent_gone():
        sys.stderr.write(f"[rank {rank}] spmdnet: the job's parent process (pid "
                         f"{parent_pid}) died; ending this rank\n")
        forward(signal.SIGTERM, None)
        time.sleep(PARENT_GONE_GRACE_S)
        forward(signal.SIGKILL, None)

    watch(parent_pid, parent_gone)
    _, wait_status = os.waitpid(child, 0)  # Python retries it across forwarded signals
    kind, value = _status(wait_status)
    if not os.path.exists(os.path.join(folder, f"status-{rank}")):  # the rank's note wins
        note(folder, f"status-{rank}", f"{kind} {value}")
    _end_like(kind, value)


def _main(argv):
    folder, parent_pid, program = argv[0], int(argv[1]), argv[2:]
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))

    def start():
        try:
            os.execvp(program[0], program)
        except OSError as exc:
            sys.stderr.write(f"[rank {rank}] spmdnet: cannot run {program[0]!r}: {exc}\n")
            os._exit(127)

    supervise(folder, rank, parent_pid, start)


if __name__ == "__main__":
    _main(sys.argv[1:])


__all__ = ["watch", "die_with_parent", "supervise", "note", "read_statuses"]
