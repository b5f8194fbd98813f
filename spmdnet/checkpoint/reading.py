"""Loading a checkpoint, collectively: every rank reads and verifies its part,
the ranks agree that all of them succeeded and read the same step, then each
restores its model, optimizer, RNG, sampler, loader and scheduler.

Every decision that leads to a collective is agreed first: a read that fails
on one rank is raised on every rank before any rank gathers a state (FSDP's
``state_dict`` is an all-gather), and every check that can refuse the
checkpoint (it fits the model, its optimizer state fits the optimizer) runs
on every rank and is agreed before anything is loaded.
"""
from pathlib import Path

from .. import distributed as dist
from .. import random as sn_random
from ..errors import CheckpointError
from ..optim.optimizer import Optimizer
from . import directory, h5format, resharding, state


def load_checkpoint(path, model, optimizer=None, *, sampler=None, loader=None, scheduler=None,
                    comm=None, mesh=None, allow_nonfinite=False):
    """Restore a checkpoint on every rank (collectively); returns its ``extra``
    dict with ``step`` added. Raises CheckpointError on every rank when the
    file is missing, incomplete, corrupt (an array fails its checksum), holds
    NaN/Inf (unless ``allow_nonfinite``) or does not fit the model, optimizer
    or world (another tp or pp; another data-parallel size is resharded, see
    ``resharding``), before anything is loaded.
    ``path`` may be a directory: its newest checkpoint that verifies on every
    rank (each rank's part of a sharded one), the same on all ranks; the
    skipped ones are named in a warning on rank 0.
    ``sampler``, ``loader`` and ``scheduler`` get their saved state back
    (when the checkpoint holds one)."""
    comm = dist.comm_or_default(comm)
    rank = resharding.part_selector(comm, mesh)
    if dist.check_same(comm, Path(path).is_dir(), f"whether {path} is a directory"):
        found, contents, skipped = directory.agreed_newest(path, comm, rank, allow_nonfinite)
        if found is None:  # the same answer on every rank
            raise CheckpointError(f"no checkpoint in {path} verifies on every rank: "
                                  f"{skipped or 'none found'}")
        path = found
    else:
        contents, error = None, None
        try:
            contents = h5format.read(path, rank, allow_nonfinite)
        except CheckpointError as exc:
            error = str(exc)
        _raise_if_any_failed(error, comm)
    return load_contents(str(path), contents, model, optimizer, sampler=sampler, loader=loader,
                         scheduler=scheduler, comm=comm, mesh=mesh)


def load_contents(path, contents, model, optimizer=None, *, sampler=None, loader=None,
                  scheduler=None, comm=None, mesh=None):
    """Restore ``contents`` (``h5format.read``'s result, read by every rank of
    ``comm`` without error) collectively; see ``load_checkpoint``."""
    meta, model_state, optimizer_state = contents
    with dist.guarded("allgather(checkpoint steps)", comm):
        steps = comm.allgather(meta["step"])
    if len(set(steps)) != 1:
        raise CheckpointError(f"ranks loaded different steps from {path}: {steps}")
    error, positions = None, {}
    try:  # every rank runs these checks: check_fits gathers an FSDP model's state
        state.check_fits(path, meta, model_state, model, comm, mesh)
        check_optimizer_state(path, model, optimizer, optimizer_state)
        for component, key in ((sampler, "sampler"), (loader, "loader")):
            if component is not None:  # a position in this world's shares
                positions[key] = resharding.remap_position(path, meta.get(key), component)
    except Exception as exc:  # agreed below, so no rank restores alone
        error = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
    _raise_if_any_failed(error, comm)
    state.restore(path, model, optimizer, model_state, optimizer_state)
    rng = resharding.rng_state_for(meta, comm, mesh)
    if rng is not None:  # else a rank the resize added: it keeps its own state
        sn_random.restore(rng)
    positions["scheduler"] = meta.get("scheduler") if scheduler is not None else None
    for component, key in ((sampler, "sampler"), (loader, "loader"), (scheduler, "scheduler")):
        if component is not None and positions.get(key) is not None:
            component.load_state_dict(positions[key])
    directory.remember_loaded(path)
    return dict(meta["extra"], step=meta["step"])


def check_optimizer_state(path, model, optimizer, optimizer_state):
    """CheckpointError, before anything is loaded, when the saved optimizer
    state cannot go into ``optimizer``: written by FSDP (keyed by parameter
    name) for a model that is not, or the other way round, or with other
    parameter group sizes."""
    if optimizer is None or optimizer_state is None:
        return
    groups = optimizer_state["param_groups"]
    by_name = any(isinstance(p, str) for g in groups for p in g["params"])
    fsdp = state.is_fsdp(model)
    if by_name and not fsdp:
        raise CheckpointError(
            f"{path}: the optimizer state was written by FullyShardedDataParallel (keyed "
            f"by parameter name); it cannot be loaded into {type(optimizer).__name__} over a "
            f"{type(model).__name__} model. Load it with an FSDP model, or pass "
            "optimizer=None to load the model only")
    if fsdp and not by_name:
        raise CheckpointError(
            f"{path}: optimizer state not saved from an FSDP model (written by DataParallel, "
            "ZeRO or a plain optimizer: keyed by parameter index); this model is "
            "FullyShardedDataParallel. Load it into the model it was written from, or pass "
            "optimizer=None to load the model only")
    if not fsdp and isinstance(optimizer, Optimizer):  # FSDP's groups hold shards
        saved = [len(g["params"]) for g in groups]
        own = [len(g["params"]) for g in optimizer.param_groups]
        if saved != own:
            raise CheckpointError(f"{path}: the optimizer state has parameter groups of "
                                  f"sizes {saved}; {type(optimizer).__name__} has {own}")


def _raise_if_any_failed(error, comm):
    """The first rank's error, raised on every rank."""
    with dist.guarded("allgather(checkpoint load errors)", comm):
        errors = comm.allgather(error)
    bad = next(((r, e) for r, e in enumerate(errors) if e is not None), None)
    if bad is not None:
        raise CheckpointError(f"rank {bad[0]}: {bad[1]}")
