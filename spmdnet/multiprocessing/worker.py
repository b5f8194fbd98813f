"""One rank of a ``spawn`` from a plain process:
``python -m spmdnet.multiprocessing.worker <job folder>`` under mpiexec.

Notes its pid (``started-<rank>``), imports the parent's main script as
``__mp_main__`` (also registered as ``__main__``, so ``fn`` pickled by
reference from the parent's ``__main__`` is found), runs ``fn(rank, *args)``,
then notes ``done-<rank>`` or ``error-<rank>`` (pid and traceback) for the
parent. An exception is re-raised after it is noted: with MPI initialised
the abort hook ends every rank at once.
"""
import importlib
import os
import pickle
import sys
import traceback
import types

from ..distributed.launcher_env import launched_rank_size
from . import processes


def _note(folder, name, content):
    """Write ``content`` to ``folder/name`` atomically (the parent polls the folder)."""
    tmp = os.path.join(folder, f".{name}.tmp")
    with open(tmp, "wb" if isinstance(content, bytes) else "w") as f:
        f.write(content)
    os.replace(tmp, os.path.join(folder, name))


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


def main(folder):
    rank, _ = launched_rank_size()
    _note(folder, f"started-{rank}", str(os.getpid()))
    with open(os.path.join(folder, "payload"), "rb") as f:
        payload = pickle.load(f)
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
    except Exception:
        _note(folder, f"error-{rank}", pickle.dumps((os.getpid(), traceback.format_exc())))
        raise
    _note(folder, f"done-{rank}", "")


if __name__ == "__main__":
    main(sys.argv[1])
