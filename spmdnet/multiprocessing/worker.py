"""One rank of a ``spawn`` from a plain process:
``python -m spmdnet.multiprocessing.worker <job folder>`` under mpiexec.

The process mpiexec starts is a small supervisor (``lifeline.supervise``):
it forks the rank, notes how the rank ended (``status-<rank>``), and ends
the rank when the parent dies, so that the parent reports the rank's own
exit code or signal, never mpiexec's, and a SIGKILLed parent leaves no job.

The rank notes its pid (``started-<rank>``), imports the parent's main
script as ``__mp_main__`` (also registered as ``__main__``, so ``fn``
pickled by reference from the parent's ``__main__`` is found), runs
``fn(rank, *args)``, then notes ``done-<rank>`` or ``error-<rank>`` (pid and
traceback). ``sys.exit(0)`` (or ``sys.exit()``) inside ``fn`` is a success,
as in PyTorch. An exception is re-raised after it is noted: with MPI
initialised the abort hook ends every rank at once.
"""
import importlib
import os
import pickle
import sys
import traceback
import types

from ..distributed.launcher_env import launched_rank_size
from . import lifeline, processes


_note = lifeline.note


def _import_main(kind, source):
    """The parent's main script as module ``__mp_main__``, without its
    ``if __name__ == "__main__":`` block."""
    if kind == "module":
        module = importlib.import_module(source)
    else:
        module = types.ModuleType("__mp_main__")
        sys.modules["__mp_main__"] = module
        if kind == "path":
            module.__file__ = source
            with open(source) as f:
                code = compile(f.read(), source, "exec")
            exec(code, module.__dict__)  # noqa: S102 - the parent's own script, as PyTorch's spawn
    sys.modules["__mp_main__"] = sys.modules["__main__"] = module
    return module


def _run_rank(folder, rank, payload):
    _note(folder, f"started-{rank}", str(os.getpid()))
    sys.path[:] = payload["sys_path"]
    sys.argv[:] = payload["argv"]
    try:
        processes._state["worker"] = True
        try:
            _import_main(*payload["main"])
        finally:
            processes._state["worker"] = False
        fn, args = pickle.loads(payload["call"])
        fn(rank, *args)
    except SystemExit as exc:
        if exc.code in (None, 0):  # PyTorch's spawn: exit code 0 is success
            _note(folder, f"done-{rank}", "")
        else:  # noted now: the exit agreement may hold the process a while
            code = exc.code if isinstance(exc.code, int) else 1
            _note(folder, f"status-{rank}", f"exit {code}")
        raise
    except Exception:
        _note(folder, f"error-{rank}", pickle.dumps((os.getpid(), traceback.format_exc())))
        raise
    _note(folder, f"done-{rank}", "")


def main(folder):
    rank, _ = launched_rank_size()
    with open(os.path.join(folder, "payload"), "rb") as f:
        payload = pickle.load(f)
    lifeline.supervise(folder, rank, payload["parent_pid"],
                       lambda: _run_rank(folder, rank, payload))


if __name__ == "__main__":
    main(sys.argv[1])
