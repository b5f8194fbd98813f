"""torch.distributed's process groups on MPI communicators.

``init_process_group`` initialises spmdnet's MPI world (``dist.init``): the
launcher (``mpirun``, ``srun``, ``python -m spmdnet.run``, ``mp.spawn``)
already decided the ranks, so every backend name ("nccl", "gloo", "mpi")
runs over MPI, ``init_method``/``store`` are accepted and unused, and a
``rank``/``world_size`` that disagrees with MPI's is a DistributedError.
``timeout=`` becomes the stall watchdog's limit (``SPMDNET_WATCHDOG_S``).

A ``ProcessGroup`` holds an MPI communicator (None on ranks outside the
group) and its members' global ranks, sorted as PyTorch sorts them. The
world's group is the default one: ``dist.init()`` alone makes it exist, so
spmdnet programs and PyTorch programs share one world.
"""
import datetime
import enum
import importlib.util
import os
import warnings

from ..errors import DistributedError
from . import agreement, guard, runtime
from ._mpi import mpi
from .checks import check_same

_NOT_INITIALIZED = ("Default process group has not been initialized, please make sure to "
                    "call init_process_group (or spmdnet's dist.init)")
_state = {"default": None, "called": False, "destroyed": False, "backend": "mpi",
          "groups": []}


class ReduceOp(enum.Enum):
    """PyTorch's reduction operations (same names and values)."""
    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7

    def __repr__(self):
        return f"<ReduceOp.{self.name}: {self.value}>"


ReduceOp.RedOpType = ReduceOp  # PyTorch spells the enum's type ReduceOp.RedOpType
_SPELLINGS = {"sum": ReduceOp.SUM, "mean": ReduceOp.AVG, "avg": ReduceOp.AVG,
              "product": ReduceOp.PRODUCT, "prod": ReduceOp.PRODUCT, "min": ReduceOp.MIN,
              "max": ReduceOp.MAX, "band": ReduceOp.BAND, "bor": ReduceOp.BOR,
              "bxor": ReduceOp.BXOR}


def as_reduce_op(op):
    """A ReduceOp from a ReduceOp or one of spmdnet's names ("sum", "mean", ...)."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str) and op.lower() in _SPELLINGS:
        return _SPELLINGS[op.lower()]
    raise ValueError(f"unknown reduction {op!r}: use dist.ReduceOp.SUM/AVG/PRODUCT/MIN/MAX/"
                     f"BAND/BOR/BXOR or one of {sorted(_SPELLINGS)}")


class ProcessGroup:
    """A set of global ranks and, on its members, their MPI communicator."""

    def __init__(self, comm, ranks, backend):
        self.comm, self.ranks, self.backend = comm, list(ranks), backend
        self.destroyed = False

    def rank(self):
        """This process's rank in the group, -1 outside it (PyTorch's get_rank(group))."""
        return self.comm.Get_rank() if self.comm is not None else -1

    def size(self):
        return len(self.ranks)

    def group_rank(self, global_rank, what="rank"):
        """The group rank of ``global_rank``; ValueError when it is not a member."""
        if global_rank not in self.ranks:
            raise ValueError(f"{what} {global_rank} is not in the process group of global "
                             f"ranks {self.ranks}")
        return self.ranks.index(global_rank)

    def __getattr__(self, name):
        """The communicator's methods (``Get_rank``, ``Allreduce`` ...), so code
        written for spmdnet's ``comm=`` arguments takes a ProcessGroup too."""
        comm = self.__dict__.get("comm")
        if comm is None:
            raise AttributeError(f"{name!r}: this rank is not in {self!r}" if "comm" in
                                 self.__dict__ else name)
        return getattr(comm, name)

    def __repr__(self):
        return f"ProcessGroup(ranks={self.ranks}, backend={self.backend!r})"


def comm_of(process_group, who):
    """The mpi4py communicator for a ``process_group=`` argument (None: the
    world's; a communicator is taken as it is); ValueError outside the group."""
    if process_group is None:
        return None
    if _outside(process_group) or (isinstance(process_group, ProcessGroup)
                                   and process_group.comm is None):
        raise ValueError(f"{who}: this rank ({runtime.world().rank}) is not in the "
                         "process_group it was given")
    return process_group.comm if isinstance(process_group, ProcessGroup) else process_group


class _GroupNamespace:
    """``dist.group.WORLD`` (the default group) and ``dist.GroupMember.NON_GROUP_MEMBER``
    (what ``new_group`` returns to a rank outside the group: PyTorch's -100)."""
    NON_GROUP_MEMBER = -100

    @property
    def WORLD(self):  # noqa: N802 - PyTorch's name
        return default_group() if is_initialized() else None


group = GroupMember = _GroupNamespace()


def is_available():
    """Whether torch.distributed can run here: mpi4py is installed (not imported)."""
    return importlib.util.find_spec("mpi4py") is not None


def is_mpi_available():
    return is_available()


def is_gloo_available():
    """Any backend name runs over MPI, so "gloo" is available wherever MPI is."""
    return is_available()


def is_nccl_available():
    """"nccl" runs over MPI (CUDA-aware or staged); True where a GPU is visible."""
    from .. import backend  # noqa: PLC0415 - a GPU probe only when asked
    return is_available() and backend.cupy_available()


def is_torchelastic_launched():
    return False


def is_initialized():
    """Whether the default process group exists: ``init_process_group`` or
    ``dist.init`` ran, and ``destroy_process_group`` has not been called since."""
    return runtime.is_initialized() and not _state["destroyed"]


def _timeout_seconds(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    if isinstance(timeout, (int, float)) and timeout > 0:
        return float(timeout)
    raise TypeError(f"timeout must be a datetime.timedelta (or seconds > 0), got {timeout!r}")


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
                       store=None, group_name="", pg_options=None, device_id=None):
    """PyTorch's ``init_process_group`` on MPI (see the module docstring)."""
    if _state["called"] and not _state["destroyed"]:
        raise ValueError("trying to initialize the default process group twice! "
                         "(call destroy_process_group first)")
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be a string or None, got {backend!r}")
    if init_method is not None and not isinstance(init_method, str):
        raise TypeError(f"init_method must be a URL string or None, got {init_method!r}")
    seconds = _timeout_seconds(timeout)
    if seconds is not None:
        # The stall watchdog is PyTorch's collective timeout; it is read when
        # MPI's world is first set up (a world set up earlier keeps its limit).
        os.environ["SPMDNET_WATCHDOG_S"] = repr(seconds)
        if runtime.is_initialized():
            guard.configure()
    world = runtime.init()
    if world_size not in (-1, None) and world_size != world.size:
        launch = (f"; launch it with `python -m spmdnet.run --nproc-per-node {world_size} "
                  f"script.py`, `mpirun -n {world_size} python script.py` or "
                  "spmdnet.multiprocessing.spawn" if world.size == 1 else "")
        raise DistributedError(f"init_process_group(world_size={world_size}) but MPI "
                               f"started {world.size} rank(s){launch}")
    if rank not in (-1, None) and rank != world.rank:
        raise DistributedError(f"init_process_group(rank={rank}) but this process is MPI "
                               f"rank {world.rank} of {world.size}: pass rank=-1 or the "
                               "launcher's RANK")
    _state.update(called=True, destroyed=False, default=None,
                  backend=(backend or "mpi").lower())
    return None


def default_group():
    """The world's ProcessGroup; ValueError (PyTorch's) before any initialisation."""
    if not is_initialized():
        raise ValueError(_NOT_INITIALIZED)
    world = runtime.world()
    pg = _state["default"]
    if pg is None or pg.comm is not world.comm:
        pg = _state["default"] = ProcessGroup(world.comm, range(world.size), _state["backend"])
    return pg


def as_group(group):
    """The ProcessGroup for ``group`` (None: the default one)."""
    if group is None:
        return default_group()
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be a ProcessGroup from dist.new_group or None, "
                        f"got {type(group).__name__}")
    if group.destroyed:
        raise ValueError(f"{group} was destroyed by destroy_process_group")
    return group


def _outside(group):
    return group is GroupMember.NON_GROUP_MEMBER or (
        isinstance(group, int) and group == GroupMember.NON_GROUP_MEMBER)


def member(group, op):
    """The group when this rank belongs to it, else None (with PyTorch's warning)."""
    pg = None if _outside(group) else as_group(group)
    if pg is None or pg.comm is None:
        warnings.warn(f"Running {op} on global rank {runtime.world().rank} which does not "
                      "belong to the given group.", stacklevel=3)
        return None
    return pg


def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
              use_local_synchronization=False, group_desc=None, device_id=None):
    """A group of the global ``ranks`` (sorted; all ranks call it, as PyTorch;
    with ``use_local_synchronization=True`` only the members call it)."""
    world_pg = default_group()
    size = world_pg.size()
    wanted = list(range(size)) if ranks is None else sorted(int(r) for r in ranks)
    if len(set(wanted)) != len(wanted) or any(not 0 <= r < size for r in wanted):
        raise ValueError(f"new_group ranks {list(ranks)} must be distinct ranks in "
                         f"[0, {size})")
    comm, me = world_pg.comm, world_pg.rank()
    if use_local_synchronization:
        if me not in wanted:
            return GroupMember.NON_GROUP_MEMBER
        with guard.guarded("new_group(local)", comm, peer=wanted[0]):
            sub = comm.Create_group(comm.Get_group().Incl(wanted))
    else:
        check_same(comm, wanted, "new_group ranks")
        MPI = mpi()
        with guard.guarded(f"new_group({wanted})", comm):
            sub = comm.Split(0 if me in wanted else MPI.UNDEFINED, key=me)
        if sub == MPI.COMM_NULL:
            return GroupMember.NON_GROUP_MEMBER
    guard.register(sub)
    pg = ProcessGroup(sub, wanted, (backend or _state["backend"]).lower())
    _state["groups"].append(pg)
    return pg


def destroy_process_group(group=None):
    """Free ``group``'s communicator; without a group, every group made by
    ``new_group`` and the default group (``is_initialized()`` is then False
    until ``init_process_group`` runs again; MPI itself stays up)."""
    targets = _state["groups"] if group is None else [as_group(group)]
    for pg in list(targets):
        if pg.comm is not None and not pg.destroyed:
            guard.forget(pg.comm)
            agreement.forget(pg.comm)
            pg.comm.Free()
        pg.destroyed, pg.comm = True, None
        if pg in _state["groups"]:
            _state["groups"].remove(pg)
    if group is None:
        if _state["default"] is not None:
            _state["default"].destroyed = True
        _state.update(default=None, destroyed=True, called=False)


def get_rank(group=None):
    """This process's rank in ``group`` (default: the world); -1 outside it."""
    if group is None:
        return default_group().rank()
    return -1 if _outside(group) else as_group(group).rank()


def get_world_size(group=None):
    """The number of ranks in ``group``; -1 on a rank outside it (PyTorch's)."""
    if group is None:
        return default_group().size()
    if _outside(group):
        return -1
    pg = as_group(group)
    return pg.size() if pg.comm is not None else -1


def get_backend(group=None):
    """The backend name given to ``init_process_group``/``new_group`` ("mpi" when none)."""
    return as_group(group).backend


def get_process_group_ranks(group):
    return list(as_group(group).ranks)


def get_global_rank(group, group_rank):
    ranks = as_group(group).ranks
    if not 0 <= group_rank < len(ranks):
        raise ValueError(f"group rank {group_rank} is outside the group of {len(ranks)} ranks")
    return ranks[group_rank]


def get_group_rank(group, global_rank):
    return as_group(group).group_rank(global_rank, "global rank")


__all__ = ["ReduceOp", "ProcessGroup", "group", "GroupMember", "is_available",
           "is_mpi_available", "is_gloo_available", "is_nccl_available",
           "is_torchelastic_launched", "init_process_group", "destroy_process_group",
           "new_group", "get_rank", "get_world_size", "get_backend",
           "get_process_group_ranks", "get_global_rank", "get_group_rank", "comm_of"]
