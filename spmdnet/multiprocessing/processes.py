"""``spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn")``.

Inside an MPI job the ranks exist already: ``fn(rank, *args)`` runs on each
(``nprocs`` must equal the job's size). From a plain process with
``nprocs > 1`` the parent writes ``fn`` and ``args`` (pickled by reference,
as PyTorch's spawn) to a job folder and starts ``mpiexec -n nprocs python -m
spmdnet.multiprocessing.worker <folder>``; each rank notes its pid, imports
the main script as ``__mp_main__``, runs ``fn(rank, *args)`` and notes
success, or its traceback, and each rank's supervisor notes how the rank
ended (``worker.py``). The parent watches the folder: a rank's exception
raises ``ProcessRaisedException`` (its rank and traceback), a rank that
ended otherwise with a nonzero code ``ProcessExitedException`` with the
rank's own ``exit_code`` (``-N`` and "terminated with signal SIGKILL" for a
signal, as PyTorch's), and the other ranks are ended; exit code 0
(``sys.exit(0)`` in ``fn``) is a success. When the parent dies, even by
SIGKILL, the ranks notice and end. SIGTERM or SIGINT to the parent reaches every rank
(mpiexec forwards it); when the ranks then stop with an agreed code (3 after
``StopSignal``), the parent exits with it. ``nprocs == 1`` in a plain
process runs ``fn(0, *args)`` in the parent itself.
"""
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from ..distributed.launcher_env import launched_rank_size
from ..errors import DistributedError

GRACE_S = 1.0  # after a failure, how long the other ranks may take to report theirs
# after a signal forwarded to the ranks, how long they may take to stop by themselves
# (each with the agreed code, at its own pace) before the job is ended
SIGNAL_GRACE_S = 30.0
_state = {"worker": False}  # True while a spawned rank imports the main script


class ProcessException(Exception):
    def __init__(self, msg, error_index, error_pid):
        super().__init__(msg)
        self.msg, self.error_index, self.pid = msg, error_index, error_pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid)


class ProcessRaisedException(ProcessException):
    """A rank's ``fn`` raised; the message holds its traceback."""


class ProcessExitedException(ProcessException):
    """A rank ended without finishing ``fn`` (exit code, signal)."""

    def __init__(self, msg, error_index, error_pid, exit_code, signal_name=None):
        super().__init__(msg, error_index, error_pid)
        self.exit_code, self.signal_name = exit_code, signal_name

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid, self.exit_code,
                            self.signal_name)


def _rank_files(folder, prefix):
    """{rank: path} for ``<prefix>-<rank>`` files in ``folder``."""
    found = {}
    for name in os.listdir(folder):
        head, _, rank = name.partition("-")
        if head == prefix and rank.isdigit():
            found[int(rank)] = os.path.join(folder, name)
    return found


class ProcessContext:
    """The running ranks of one ``spawn``; ``join()`` as PyTorch's."""

    def __init__(self, proc, folder, nprocs):
        self.proc, self.folder, self.nprocs = proc, folder, nprocs
        self.signal_received = None
        self._failed_at = self._first_dead = None

    def pids(self):
        return [int(open(p).read() or 0) for _, p in sorted(_rank_files(self.folder,
                                                                          "started").items())]

    def _statuses(self):
        """{rank: ("exit", code) or ("signal", number)} noted by the ranks' supervisors."""
        found = {}
        for rank, path in _rank_files(self.folder, "status").items():
            kind, _, value = open(path).read().partition(" ")
            found[rank] = (kind, int(value))
        return found

    def _failure(self):
        """Whether a rank has raised or ended without finishing; the first
        rank seen failing is kept (after it, the launcher ends the others)."""
        if _rank_files(self.folder, "error"):
            return True
        failed = [r for r, st in self._statuses().items() if st != ("exit", 0)]
        if failed and self._first_dead is None:
            self._first_dead = min(failed, key=lambda r: (os.path.getmtime(
                os.path.join(self.folder, f"status-{r}")), r))
        return bool(failed)

    def join(self, timeout=None):
        """Wait for the ranks (at most ``timeout`` s): True when all finished,
        False while they run; raises when one failed (the others are ended)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.proc.poll() is None:
            if self._failed_at is None and self._failure():
                self._failed_at = time.monotonic()
            grace = GRACE_S if self.signal_received is None else SIGNAL_GRACE_S
            if self._failed_at is not None and time.monotonic() - self._failed_at > grace:
                self._end()
                break
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return self._result(self.proc.wait())

    def _exited(self, code, missing, started):
        """PyTorch's ProcessExitedException for the first rank that failed:
        its own exit code, or ``-signal`` and the signal's name."""
        if self._first_dead is None:  # the job ended before join() saw a status: look now
            self._failure()
        statuses = self._statuses()
        rank = self._first_dead if self._first_dead is not None else \
            missing[0] if missing else 0
        pid = int(open(started[rank]).read() or 0) if rank in started else -1
        kind, value = statuses.get(rank, ("exit", code))
        if kind == "signal" or value < 0:
            number = abs(value)
            name = signal.Signals(number).name if number in signal.Signals._value2member_map_ \
                else f"signal {number}"
            return ProcessExitedException(f"process {rank} terminated with signal {name}",
                                          rank, pid, -number, name)
        return ProcessExitedException(f"process {rank} terminated with exit code {value}",
                                      rank, pid, value)

    def _end(self):
        """End the job: SIGTERM through mpiexec, then SIGKILL."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _result(self, code):
        try:
            errors = _rank_files(self.folder, "error")
            if errors:
                rank = min(errors)
                with open(errors[rank], "rb") as f:
                    pid, text = pickle.load(f)
                raise ProcessRaisedException(f"\n\n-- Process {rank} terminated with the "
                                             f"following error:\n{text}", rank, pid)
            done = _rank_files(self.folder, "done")
            started = _rank_files(self.folder, "started")
            ok = set(done) | {r for r, st in self._statuses().items() if st == ("exit", 0)}
            missing = [r for r in range(self.nprocs) if r not in ok]
            if code or missing:
                if self.signal_received is not None and code:
                    sys.exit(code)  # the ranks stopped on the parent's signal: their code
                raise self._exited(code, missing, started)
            return True
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
            from .. import launch  # noqa: PLC0415 - `python -m spmdnet.launch` needs it unimported
            launch.clean_topology_files()


def _main_source():
    """How a rank finds the parent's main script: ("module", name) or ("path", file)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", None):
        return "module", spec.name
    path = getattr(main, "__file__", None)
    return ("path", os.path.abspath(path)) if path else (None, None)


def _forward_signals(context):
    """SIGTERM/SIGINT to the parent go to mpiexec, which forwards them to the ranks."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def forward(signum, frame):
        context.signal_received = signum
        if context.proc.poll() is None:
            context.proc.send_signal(signum)

    return {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}


def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    """``spawn`` with PyTorch's ``start_method`` (every method starts MPI ranks)."""
    if _state["worker"]:
        raise RuntimeError("spawn() was called while a spawned rank imported the main "
                           "script: guard the call with `if __name__ == \"__main__\":`")
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"spawn: nprocs must be a positive int, got {nprocs!r}")
    rank, size = launched_rank_size()
    if rank is not None:
        if size != nprocs:
            raise DistributedError(
                f"spawn(nprocs={nprocs}) inside an MPI job of {size} rank(s): launch "
                f"{nprocs} ranks (`mpirun -n {nprocs} ...`) or pass nprocs={size}")
        fn(rank, *args)
        return None if join else _Finished()
    if nprocs == 1:
        fn(0, *args)
        return None if join else _Finished()
    context = _start(fn, args, nprocs)
    if not join:
        return context
    previous = _forward_signals(context)
    try:
        while not context.join():
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return None


def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    """Run ``fn(rank, *args)`` on ``nprocs`` ranks (see the module docstring)."""
    return start_processes(fn, args, nprocs, join, daemon, start_method)


class _Finished:
    """The context of a spawn that ran in this process: already joined."""

    def join(self, timeout=None):
        return True


def _start(fn, args, nprocs):
    kind, source = _main_source()
    folder = tempfile.mkdtemp(prefix="spmdnet-spawn-")
    payload = {"main": (kind, source), "sys_path": list(sys.path), "argv": list(sys.argv),
               "cwd": os.getcwd(), "parent_pid": os.getpid()}
    try:
        payload["call"] = pickle.dumps((fn, tuple(args)))
    except Exception as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise TypeError(f"spawn: fn and args must be picklable by reference (a function "
                        f"defined at module level), got {fn!r}: {exc}") from exc
    with open(os.path.join(folder, "payload"), "wb") as f:
        pickle.dump(payload, f)
    from .. import launch  # noqa: PLC0415 - `python -m spmdnet.launch` needs it unimported
    command = launch.command(nprocs, "-m", "spmdnet.multiprocessing.worker", folder)
    proc = subprocess.Popen(command, env=launch.job_env())
    return ProcessContext(proc, folder, nprocs)
