"""Checkpoints that never lose work: one HDF5 file, written atomically.

A checkpoint holds the model state, the optimizer state, every rank's RNG
state, the sampler's epoch and position, the step, the world layout and the
spmdnet version, plus any JSON-able ``extra`` values. Rank 0 writes it to a
temporary name, fsyncs, renames it into place and fsyncs the directory: a
crash at any moment leaves the previous checkpoint intact. Every rank then
learns whether the write succeeded, so an error is raised on all of them.

``path`` may be a directory: checkpoints are then ``ckpt-<step>.h5`` inside
it, the file ``latest`` names the newest complete one, and only the newest
``keep`` are kept (and the newest one this process loaded cleanly). Every
array carries a checksum; NaN/Inf are refused; a resume skips a newest file
that does not verify; ``check_checkpoint_dir`` probes the directory before
training (see ``checkpoint_io`` for temporaries and a full disk).

With data parallelism only, every rank holds the same model and optimizer
state and rank 0's is saved. With a ``mesh`` whose tensor- or pipeline-
parallel size is above 1, ranks hold different parts: every rank's state is
gathered to rank 0 and saved under ``rank<r>/``, and only the same layout
can load it (use ``parallel.gather_state_dict`` to export a serial model).
An FSDP model saves its full state and ``fsdp.optim_state_dict`` (every
rank's optimizer shards gathered, keyed by parameter name); loading shards them.
"""
import functools
import io
import json
import os
from pathlib import Path

import numpy as np

from .version import __version__
from . import distributed as dist
from . import checkpoint_io as ckio
from . import random as sn_random
from .errors import CheckpointError

FORMAT = 1
LATEST = "latest"
_loaded_cleanly = {}  # checkpoint directory -> the newest file this process loaded


def _h5py():
    import h5py  # noqa: PLC0415 - 0.1 s to import: on first save or load only
    return h5py


def _unwrap(model):
    """The module inside a DataParallel (its state is the model's state)."""
    return getattr(model, "module", model)


def _is_fsdp(model):
    """A FullyShardedDataParallel model: its optimizer state is gathered by name."""
    return hasattr(model, "optim_state_dict") and hasattr(model, "load_optim_state_dict")


def _layout(comm, mesh):
    tp = mesh.tp.Get_size() if mesh is not None else 1
    pp = mesh.pp.Get_size() if mesh is not None else 1
    return {"size": comm.Get_size(), "tp": tp, "pp": pp}


# -- writing ------------------------------------------------------------------------
def save_checkpoint(path, model, optimizer=None, *, sampler=None, step=0, keep=3, comm=None,
                    mesh=None, allow_nonfinite=False, **extra):
    """Save a checkpoint collectively (every rank calls it); returns its path.

    ``sampler`` (a DistributedSampler) saves its epoch and position; ``extra``
    values must be JSON-serialisable (e.g. a scheduler's state_dict). A NaN or
    Inf in the model or optimizer state is refused (CheckpointError naming the
    array) unless ``allow_nonfinite``. Rank 0 decides every outcome and all
    ranks raise the same CheckpointError: a full disk, an unwritable
    directory, a failed rotation. Stale temporaries of interrupted saves in
    the directory are removed first (see ``checkpoint_io``)."""
    comm = dist.comm_or_default(comm)
    with dist.guarded("gather(checkpoint RNG states)", comm):
        rng_states = comm.gather(sn_random.get_rng_state(), root=0)
    sharded = _is_sharded(mesh)
    states = [_local_states(model, optimizer)]
    if sharded:
        with dist.guarded("gather(checkpoint shards)", comm):
            states = comm.gather(states[0], root=0)
    target, directory = _target(path, step)
    error = None
    if comm.Get_rank() == 0:
        meta = {"format": FORMAT, "version": __version__, "step": int(step),
                "layout": _layout(comm, mesh), "rng": rng_states,
                "sampler": sampler.state_dict() if sampler is not None else None,
                "extra": extra}
        error = _save_on_root(target, directory, states, meta, keep,
                              None if allow_nonfinite else _param_names(model, optimizer))
    with dist.guarded("bcast(checkpoint saved)", comm):
        error = comm.bcast(error, root=0)
    if error is not None:
        raise CheckpointError(f"saving checkpoint {target} failed on rank 0: {error}")
    return str(target)


def _save_on_root(target, directory, states, meta, keep, names):
    """Everything rank 0 does to save; returns an error string or None (never
    raises: the other ranks wait for the answer). ``names``: None to allow
    non-finite values."""
    try:
        json.dumps(meta["extra"])
    except TypeError as exc:
        return f"extra values must be JSON-serialisable: {exc}"
    if names is not None:
        bad = ckio.describe_nonfinite(states, names)
        if bad:
            return (f"refusing to save non-finite values: {bad} (step {meta['step']}); "
                    "pass allow_nonfinite=True to save them anyway")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        ckio.remove_stale_temporaries(target.parent,
                                      None if directory is not None else target.name)
        error = _write(target, states, meta)
        if error is None and directory is not None:
            try:
                _point_latest(directory, target.name)
            except OSError as exc:  # e.g. a full disk: leave the directory as it was
                target.unlink()
                return f"the file {LATEST!r} could not be updated, so it was removed: {exc}"
            _rotate(directory, keep, keep_also=target.name)
        return error
    except Exception as exc:  # reported on every rank by the caller
        return f"{type(exc).__name__}: {exc}"


def _target(path, step):
    """(file to write, checkpoint directory or None): a path that is a
    directory or ends with a separator names a rotating directory."""
    if str(path).endswith(os.sep) or Path(path).is_dir():
        return Path(path) / f"ckpt-{int(step):08d}.h5", Path(path)
    return Path(path), None


def check_checkpoint_dir(path, comm=None):
    """Fail before the first step, not at the first save: rank 0 (the rank
    that writes checkpoints) creates ``path`` if needed, then creates, fsyncs
    and removes a probe file in it. A file in its place, a read-only or
    uncreatable directory raises CheckpointError naming the path and the
    reason on every rank of ``comm`` (collectively). Returns the path."""
    comm = dist.comm_or_default(comm)
    reason = ckio.probe(Path(path)) if comm.Get_rank() == 0 else None
    with dist.guarded("bcast(checkpoint directory probe)", comm):
        reason = comm.bcast(reason, root=0)
    if reason is not None:
        raise CheckpointError(f"checkpoint directory {path} is not usable on rank 0: {reason}")
    return str(path)


def _is_sharded(mesh):
    return mesh is not None and (mesh.tp.Get_size() > 1 or mesh.pp.Get_size() > 1)


def _local_states(model, optimizer):
    """(model state, optimizer state or None) of this rank (collective for
    optimizers whose state_dict gathers, e.g. ZeroRedundancyOptimizer)."""
    model_state = _unwrap(model).state_dict()
    return model_state, None if optimizer is None else model.optim_state_dict(optimizer) \
        if _is_fsdp(model) else optimizer.state_dict()  # FSDP: every rank's shards, by name


def _write(target, states, meta):
    """Build the file in memory, write it to a temporary, fsync, rename, fsync
    the directory; returns an error string. ``states``: one (model, optimizer)
    pair, or one per rank (sharded). In memory first, so that HDF5 never sees
    an I/O error (a full disk is one clean OSError naming the bytes needed);
    rank 0 holds a second copy of the checkpoint while it is written."""
    tmp = ckio.temp_name(target)
    try:
        image = io.BytesIO()
        with _h5py().File(image, "w") as f:
            for r, (model_state, opt_state) in enumerate(states):
                group = f if len(states) == 1 else f.create_group(f"rank{r}")
                for name, array in model_state.items():
                    _put(group, f"model/{name}", array)
                if opt_state is not None:
                    _write_optimizer(group, opt_state)
            f.attrs["meta"] = json.dumps(meta)
            f.attrs["complete"] = True  # last: a file without it is incomplete
        ckio.write_bytes(tmp, image.getbuffer())
        _fsync(tmp)
        os.replace(tmp, target)
        _fsync(target.parent)
        return None
    except Exception as exc:  # reported on every rank by the caller
        return f"{type(exc).__name__}: {exc}"
    finally:
        tmp.unlink(missing_ok=True)


def _put(group, name, array):
    """One array and its checksum (verified by ``_get``)."""
    array = np.asarray(array)
    group.create_dataset(name, data=array).attrs["checksum"] = ckio.checksum(array)


def _fsync(path):
    ckio.fsync(path)


def _write_optimizer(f, state):
    f.attrs["optimizer_groups"] = json.dumps(state["param_groups"])
    by_name = any(isinstance(p, str) for g in state["param_groups"] for p in g["params"])
    f.attrs["optimizer_by_name"] = by_name
    for index, entries in state["state"].items():
        for key, value in entries.items():
            _put(f, f"optimizer/{index}/{key}", value)


def _point_latest(directory, name):
    tmp = ckio.temp_name(directory / LATEST)
    try:
        ckio.write_bytes(tmp, (name + "\n").encode())
        _fsync(tmp)
        os.replace(tmp, directory / LATEST)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync(directory)


def _rotate(directory, keep, keep_also):
    """Keep the ``keep`` newest checkpoints, ``keep_also`` (the one just
    written) and the newest one this process loaded cleanly."""
    if keep is None or keep < 1:
        return
    pinned = {keep_also, _loaded_cleanly.get(str(directory.resolve()))}
    for old in sorted(directory.glob("ckpt-*.h5"))[:-keep]:
        if old.name not in pinned:
            old.unlink()


def _param_names(model, optimizer):
    """{optimizer state index: parameter name} (``#i`` where unknown)."""
    if optimizer is None:
        return {}
    if _is_fsdp(model):  # the optimizer state is keyed by name already
        return {n: n for f in model.flats() for n in f.names}
    names = {id(p): name for name, p in _unwrap(model).named_parameters()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return {i: names.get(id(p), f"#{i}") for i, p in enumerate(params)}


def latest_checkpoint(directory, verify=True, allow_nonfinite=False):
    """The newest checkpoint in ``directory`` that is complete and verifies
    (checksums and finite values, as ``load_checkpoint`` checks), or None.
    Newer ones that fail (truncated, corrupt, NaN) are skipped with a warning
    on rank 0 naming each and why, so one bad file never blocks a resume.
    ``verify=False``: the newest by name, unread."""
    found = _newest_verified(directory, allow_nonfinite)[0] if verify \
        else next(iter(_candidates(Path(directory))), None)
    return None if found is None else str(found)


def _newest_verified(directory, allow_nonfinite):
    """(path, ``_read``'s result) of the newest checkpoint that verifies, or (None, None)."""
    for candidate in _candidates(Path(directory)):
        try:
            return candidate, _read(candidate, allow_nonfinite=allow_nonfinite)
        except CheckpointError as exc:
            if dist.rank_label() in (0, "?"):
                dist.get_logger().warning(f"skipping checkpoint {candidate}: {exc}")
    return None, None


def _candidates(directory):
    """Checkpoints newest first: the one ``latest`` names, then the others."""
    if not directory.is_dir():
        return []
    found = sorted(directory.glob("ckpt-*.h5"), reverse=True)
    try:
        named = directory / (directory / LATEST).read_text().strip()
    except OSError:
        return found
    return [named] + [p for p in found if p != named] if named in found else found


# -- reading ------------------------------------------------------------------------
def load_checkpoint(path, model, optimizer=None, *, sampler=None, comm=None, mesh=None,
                    allow_nonfinite=False):
    """Restore a checkpoint on every rank (collectively); returns its ``extra``
    dict with ``step`` added. Raises CheckpointError on every rank when the
    file is missing, incomplete, corrupt (an array fails its checksum), holds
    NaN/Inf (unless ``allow_nonfinite``) or does not fit the model or world.
    ``path`` may be a directory: its newest checkpoint that verifies."""
    comm = dist.comm_or_default(comm)
    rank, contents = comm.Get_rank() if _is_sharded(mesh) else None, None
    if Path(path).is_dir():
        found, contents = _newest_verified(path, allow_nonfinite)
        if found is None:  # none verifies: the error will say why the newest does not
            found = next(iter(_candidates(Path(path))), Path(path) / LATEST)
        path = str(found)
    try:  # the verified file read whole is this rank's part unless sharded
        meta, model_state, opt_state = contents if contents is not None and rank is None \
            else _read(path, rank, allow_nonfinite)
        _check_fits(path, meta, model_state, _unwrap(model), comm, mesh)
        error = None
    except CheckpointError as exc:
        error = str(exc)
    with dist.guarded("allgather(checkpoint load errors)", comm):
        errors = comm.allgather(error)
    bad = next(((r, e) for r, e in enumerate(errors) if e is not None), None)
    if bad is not None:
        raise CheckpointError(f"rank {bad[0]}: {bad[1]}")
    with dist.guarded("allgather(checkpoint steps)", comm):
        steps = comm.allgather(meta["step"])
    if len(set(steps)) != 1:
        raise CheckpointError(f"ranks loaded different steps from {path}: {steps}")
    if optimizer is not None and opt_state is not None and _is_fsdp(model) and not all(
            isinstance(p, str) for g in opt_state["param_groups"] for p in g["params"]):
        raise CheckpointError(f"{path}: optimizer state not saved from an FSDP model")
    _unwrap(model).load_state_dict(model_state)
    if optimizer is not None and opt_state is not None and _is_fsdp(model):
        model.load_optim_state_dict(optimizer, opt_state)  # this rank's slices
    elif optimizer is not None and opt_state is not None:
        optimizer.load_state_dict(opt_state)
    sn_random.set_rng_state(meta["rng"][comm.Get_rank()])
    if sampler is not None and meta["sampler"] is not None:
        sampler.load_state_dict(meta["sampler"])
    _loaded_cleanly[str(Path(path).parent.resolve())] = Path(path).name
    return dict(meta["extra"], step=meta["step"])


def _read(path, rank=None, allow_nonfinite=False):
    """(meta, model state, optimizer state) from the file, every array checked
    against its checksum; ``rank`` selects that rank's part of a sharded
    checkpoint."""
    if not Path(path).exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        with _h5py().File(path, "r") as f:
            if not f.attrs.get("complete", False) or "meta" not in f.attrs:
                raise CheckpointError(f"checkpoint {path} is incomplete (no completion mark)")
            meta = json.loads(f.attrs["meta"])
            group = f if rank is None else f.get(f"rank{rank}")
            if group is None:
                raise CheckpointError(f"checkpoint {path} holds no state for rank {rank}")
            get = functools.partial(_get, path=path, allow_nonfinite=allow_nonfinite)
            model_state = {name: get(ds) for name, ds in group["model"].items()} \
                if "model" in group else {}
            opt_state = _read_optimizer(group, get) if "optimizer_groups" in group.attrs \
                else None
    except CheckpointError:
        raise
    except Exception as exc:  # h5py's message says what is wrong with the file
        raise CheckpointError(f"checkpoint {path} is unreadable or corrupt: {exc}") from exc
    return meta, model_state, opt_state


def _get(ds, path, allow_nonfinite):
    """A dataset's array, checked against its checksum (files written before
    checksums have none) and, unless allowed, for NaN/Inf."""
    value = ds[()]
    stored = ds.attrs.get("checksum")
    if stored is not None and ckio.checksum(value) != stored:
        raise CheckpointError(f"checkpoint {path} is corrupt: array {ds.name} does not match "
                              "the checksum written with it")
    if not allow_nonfinite and (n := ckio.count_nonfinite(value)):
        raise CheckpointError(f"checkpoint {path}: array {ds.name} holds {n} NaN/Inf values "
                              "(load with allow_nonfinite=True to accept them)")
    return value


def _read_optimizer(f, get):
    state = {}
    key = str if f.attrs.get("optimizer_by_name", False) else int
    if "optimizer" in f:
        for index, group in f["optimizer"].items():
            state[key(index)] = {k: _scalar_or_array(get(v)) for k, v in group.items()}
    groups = json.loads(f.attrs["optimizer_groups"])
    for group in groups:  # JSON made tuples (betas) into lists
        group.update({k: tuple(v) for k, v in group.items() if k != "params" and
                      isinstance(v, list)})
    return {"state": state, "param_groups": groups}


def _scalar_or_array(value):
    return value.item() if np.ndim(value) == 0 else value


def _check_fits(path, meta, model_state, model, comm, mesh):
    step = meta.get("step")
    layout = _layout(comm, mesh)
    if meta.get("layout") != layout:
        raise CheckpointError(f"checkpoint {path} (step {step}) was written by world layout "
                              f"{meta.get('layout')}, this job is {layout}")
    if len(meta.get("rng", [])) != comm.Get_size():
        raise CheckpointError(f"checkpoint {path} (step {step}) holds RNG states of "
                              f"{len(meta.get('rng', []))} ranks, this job has {comm.Get_size()}")
    own = model.state_dict()
    saved = {name: np.shape(value) for name, value in model_state.items()}
    missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    shapes = [f"{k}: checkpoint {saved[k]} vs model {own[k].shape}" for k in own
              if k in saved and tuple(saved[k]) != own[k].shape]
    if missing or unexpected or shapes:
        raise CheckpointError(f"checkpoint {path} (step {step}) does not fit the model: "
                              f"missing {missing}, unexpected {unexpected}, shapes {shapes}")
