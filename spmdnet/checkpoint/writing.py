"""Saving a checkpoint, collectively: every rank contributes its RNG state (and,
sharded, its part of the model), rank 0 checks and writes the file, and every
rank learns the outcome, so an error is raised on all of them."""
import json

from .. import distributed as dist
from .. import random as sn_random
from ..errors import CheckpointError
from ..version import __version__
from . import directory, files, h5format, integrity, state


def save_checkpoint(path, model, optimizer=None, *, sampler=None, loader=None, scheduler=None,
                    step=0, keep=3, comm=None, mesh=None, allow_nonfinite=False, **extra):
    """Save a checkpoint collectively (every rank calls it); returns its path.

    ``sampler`` (a DistributedSampler), ``loader`` (a DataLoader) and
    ``scheduler`` (an lr_scheduler) save their state_dicts, which
    ``load_checkpoint`` restores; ``extra`` values must be JSON-serialisable.
    A NaN or Inf in the model or optimizer state is refused (CheckpointError
    naming the array) unless ``allow_nonfinite``. Rank 0 decides every
    outcome and all ranks raise the same CheckpointError: a full disk, an
    unwritable directory, a failed rotation. Stale temporaries of interrupted
    saves in the directory are removed first (see ``files``)."""
    comm = dist.comm_or_default(comm)
    with dist.guarded("gather(checkpoint RNG states)", comm):
        rng_states = comm.gather(sn_random.snapshot(), root=0)
    states = [state.local_states(model, optimizer)]
    if state.is_sharded(mesh):
        with dist.guarded("gather(checkpoint shards)", comm):
            states = comm.gather(states[0], root=0)
    file, rotating = directory.target(path, step)
    error = None
    if comm.Get_rank() == 0:
        meta = {"format": h5format.FORMAT, "version": __version__, "step": int(step),
                "layout": state.layout(comm, mesh), "rng": rng_states,
                "sampler": _state_of(sampler), "loader": _state_of(loader),
                "scheduler": _state_of(scheduler), "extra": extra}
        names = None if allow_nonfinite else state.parameter_names(model, optimizer)
        error = _save_on_root(file, rotating, states, meta, keep, names)
    with dist.guarded("bcast(checkpoint saved)", comm):
        error = comm.bcast(error, root=0)
    if error is not None:
        raise CheckpointError(f"saving checkpoint {file} failed on rank 0: {error}")
    return str(file)


def _state_of(component):
    return None if component is None else component.state_dict()


def _save_on_root(file, rotating, states, meta, keep, names):
    """Everything rank 0 does to save; returns an error string or None (never
    raises: the other ranks wait for the answer). ``rotating``: the checkpoint
    directory, or None for a single file. ``names``: None to allow non-finite
    values."""
    try:
        json.dumps(meta)
    except TypeError as exc:
        return f"extra values must be JSON-serialisable: {exc}"
    if names is not None:
        bad = integrity.describe_nonfinite(states, names)
        if bad:
            return (f"refusing to save non-finite values: {bad} (step {meta['step']}); "
                    "pass allow_nonfinite=True to save them anyway")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        files.remove_stale_temporaries(file.parent, None if rotating is not None else file.name)
        files.write_atomically(file, h5format.file_image(states, meta))
    except Exception as exc:  # reported on every rank by the caller
        return f"{type(exc).__name__}: {exc}"
    if rotating is None:
        return None
    try:
        directory.point_latest(rotating, file.name)
    except OSError as exc:  # e.g. a full disk: leave the directory as it was
        file.unlink()
        return f"the file {directory.LATEST!r} could not be updated, so it was removed: {exc}"
    try:
        directory.rotate(rotating, keep, keep_also=file.name)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
