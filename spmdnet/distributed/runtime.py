"""The MPI world of this process: communicator, ranks, node-local rank, device.

mpi4py is imported on first use (``init``), so ``import spmdnet`` needs no
MPI launch. Under ``mpirun``/``mpiexec``/``srun`` the world is the launched
job; as a plain ``python`` process it is a world of size 1.
"""
import faulthandler
import logging
import os
import sys

from .. import backend, config
from . import agreement, exits, guard, watchdog
from ._mpi import mpi
from .abort import install as install_abort_hook
from .crosscheck import CrossCheck
from .slurm import describe_job

EXIT_TIMEOUT_S = 30.0
_state = {"world": None, "control": None}  # read through world(), is_initialized(), ...


class World:
    """What ``dist.init`` found: read it through the module functions."""

    def __init__(self, comm, MPI):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        # Node-local rank from a shared-memory split, never from hostnames.
        self.local_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = self.local_comm.Get_rank(), self.local_comm.Get_size()
        self.thread_level = MPI.Query_thread()
        self.thread_multiple = self.thread_level >= MPI.THREAD_MULTIPLE
        self.device = _bind_device(self.local_rank)

    def free(self):
        if self.local_comm is not None:
            self.local_comm.Free()
            self.local_comm = None


def _bind_device(local_rank):
    """Use GPU ``local_rank % device_count`` when asked for or available."""
    choice = config.get_choice("SPMDNET_DEVICE", {"auto", "cpu", "gpu"}, "auto")
    if choice == "cpu" or (choice == "auto" and not backend.cupy_available()):
        return "cpu"
    if not backend.cupy_available():
        raise RuntimeError("SPMDNET_DEVICE=gpu but no CUDA device is visible to CuPy")
    backend.use_gpu(local_rank % backend.gpu_count())
    return "gpu"


def init(comm=None):
    """Initialise spmdnet's MPI world once (later calls return it).

    ``comm`` defaults to ``MPI.COMM_WORLD``; passing a different one
    re-initialises on it. Installs the abort-on-exception hook unless
    ``SPMDNET_ABORT_ON_ERROR=0``. Returns the World.
    """
    MPI = mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    world = _state["world"]
    if world is not None and world.comm == comm:
        return world
    if world is not None:
        world.free()
    world = _state["world"] = World(comm, MPI)
    _enable_faulthandler()
    _start_services(world)
    if config.get_bool("SPMDNET_ABORT_ON_ERROR", True):
        install_abort_hook()
    job = describe_job()
    if job and world.rank == 0:
        print(f"[rank 0] spmdnet: {job}", file=sys.stderr, flush=True)
    return world


def _enable_faulthandler():
    """Python's tracebacks on a fatal signal, in every rank: a memory-mapped
    data file rewritten under a running job ends it with SIGBUS, and without
    this the only word is the launcher's "Bus error", naming no line. Left as
    it is when the program enabled it already (its own file, say)."""
    if not faulthandler.is_enabled():
        faulthandler.enable(file=sys.stderr, all_threads=True)


def _start_services(world):
    """Once per process: a private Dup of the world for the check mode, the
    watchdog and the exit agreement; the knobs are read (and validated) here."""
    limit = guard.configure()
    exit_s = config.get_seconds("SPMDNET_EXIT_TIMEOUT_S", EXIT_TIMEOUT_S)
    if _state["control"] is not None:
        return
    control = _state["control"] = world.comm.Dup()
    guard.set_checker(CrossCheck(control, world.comm))
    guard.register(world.comm)
    if world.size > 1:
        if limit:
            settings = guard.settings()
            watchdog.start(control, limit, settings["abort_s"], world.thread_multiple)
        exits.install(control, exit_s)


def dup(comm=None):
    """A private duplicate of ``comm`` (default: the world), known to the
    collective check mode (collective over ``comm``). Free it with ``free``."""
    new = comm_or_default(comm).Dup()
    guard.register(new)
    return new


def free(comm):
    """Free a communicator made by ``dup`` or ``Mesh``."""
    guard.forget(comm)
    agreement.forget(comm)
    comm.Free()


def world():
    """The World, initialising with COMM_WORLD on first use."""
    return _state["world"] or init()


def is_initialized():
    """Whether ``init`` has run in this process (PyTorch's name); never initialises."""
    return _state["world"] is not None


def bound_device():
    """"gpu" or "cpu": the device ``init`` bound this rank to, and "cpu"
    before ``init`` (never initialises MPI). Loaders and evaluation move
    host batches there."""
    w = _state["world"]
    return w.device if w is not None else "cpu"


def rank_label():
    """This process's world rank for messages, without initialising MPI:
    the world's rank, else the launcher's environment, else "?"."""
    w = _state["world"]
    if w is not None:
        return w.rank
    for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMIX_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return "?"


def comm_or_default(comm=None):
    """``comm`` if given, else the world's communicator."""
    return comm if comm is not None else world().comm


def rank():
    return world().rank


def size():
    return world().size


def local_rank():
    return world().local_rank


def is_root():
    return world().rank == 0


def comm_barrier(comm=None):
    """Wait until every rank of ``comm`` (default: the world's) has arrived
    (``dist.barrier`` is PyTorch's ``barrier(group)``)."""
    comm = comm_or_default(comm)
    with guard.guarded("barrier", comm):
        comm.Barrier()


def print0(*args, **kwargs):
    """``print`` on rank 0 only (flushed, so output interleaves sensibly)."""
    if is_root():
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


class _RankFilter(logging.Filter):
    def filter(self, record):
        w = _state["world"]
        record.rank = w.rank if w is not None else rank_label()
        return True


def get_logger():
    """The "spmdnet" logger; every line is tagged ``[rank N]``."""
    logger = logging.getLogger("spmdnet")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.addFilter(_RankFilter())
        handler.setFormatter(logging.Formatter("[rank %(rank)s] spmdnet %(levelname)s: "
                                               "%(message)s"))
        logger.addHandler(handler)
        levels = {"debug", "info", "warning", "error"}
        logger.setLevel(config.get_choice("SPMDNET_LOG_LEVEL", levels, "warning").upper())
        logger.propagate = False
    return logger
