"""Loading a checkpoint, collectively: every rank reads and verifies its part,
the ranks agree that all of them succeeded and read the same step, then each
restores its model, optimizer, RNG, sampler, loader and scheduler."""
from pathlib import Path

from .. import distributed as dist
from .. import random as sn_random
from ..errors import CheckpointError
from . import directory, h5format, state


def load_checkpoint(path, model, optimizer=None, *, sampler=None, loader=None, scheduler=None,
                    comm=None, mesh=None, allow_nonfinite=False):
    """Restore a checkpoint on every rank (collectively); returns its ``extra``
    dict with ``step`` added. Raises CheckpointError on every rank when the
    file is missing, incomplete, corrupt (an array fails its checksum), holds
    NaN/Inf (unless ``allow_nonfinite``) or does not fit the model or world.
    ``path`` may be a directory: its newest checkpoint that verifies.
    ``sampler``, ``loader`` and ``scheduler`` get their saved state back
    (when the checkpoint holds one)."""
    comm = dist.comm_or_default(comm)
    rank = comm.Get_rank() if state.is_sharded(mesh) else None
    path, contents = _resolve(path, allow_nonfinite)
    try:
        if contents is None or rank is not None:  # sharded: this rank's part only
            contents = h5format.read(path, rank, allow_nonfinite)
        meta, model_state, optimizer_state = contents
        state.check_fits(path, meta, model_state, model, comm, mesh)
        error = None
    except CheckpointError as exc:
        error = str(exc)
    _raise_if_any_failed(error, comm)
    with dist.guarded("allgather(checkpoint steps)", comm):
        steps = comm.allgather(meta["step"])
    if len(set(steps)) != 1:
        raise CheckpointError(f"ranks loaded different steps from {path}: {steps}")
    state.restore(path, model, optimizer, model_state, optimizer_state)
    sn_random.set_rng_state(meta["rng"][comm.Get_rank()])
    for component, key in ((sampler, "sampler"), (loader, "loader"), (scheduler, "scheduler")):
        if component is not None and meta.get(key) is not None:
            component.load_state_dict(meta[key])
    directory.remember_loaded(path)
    return dict(meta["extra"], step=meta["step"])


def _resolve(path, allow_nonfinite):
    """(file, its contents already read or None): a directory means its newest
    checkpoint that verifies (read whole while verifying)."""
    if not Path(path).is_dir():
        return str(path), None
    found, contents = directory.newest_verified(path, allow_nonfinite)
    if found is None:  # none verifies: the error will say why the newest does not
        found = next(iter(directory.candidates(path)), Path(path) / directory.LATEST)
    return str(found), contents


def _raise_if_any_failed(error, comm):
    """The first rank's error, raised on every rank."""
    with dist.guarded("allgather(checkpoint load errors)", comm):
        errors = comm.allgather(error)
    bad = next(((r, e) for r, e in enumerate(errors) if e is not None), None)
    if bad is not None:
        raise CheckpointError(f"rank {bad[0]}: {bad[1]}")
