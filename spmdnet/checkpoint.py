"""Checkpoints that never lose work: one HDF5 file, written atomically.

A checkpoint holds the model state, the optimizer state, every rank's RNG
state, the sampler's epoch and position, the step, the world layout and the
spmdnet version, plus any JSON-able ``extra`` values. Rank 0 writes it to a
temporary name, fsyncs, renames it into place and fsyncs the directory: a
crash at any moment leaves the previous checkpoint intact. Every rank then
learns whether the write succeeded, so an error is raised on all of them.

``path`` may be a directory: checkpoints are then ``ckpt-<step>.h5`` inside
it, the file ``latest`` names the newest complete one, and only the newest
``keep`` are kept.

With data parallelism only, every rank holds the same model and optimizer
state and rank 0's is saved. With a ``mesh`` whose tensor- or pipeline-
parallel size is above 1, ranks hold different parts: every rank's state is
gathered to rank 0 and saved under ``rank<r>/``, and only the same layout
can load it (use ``parallel.gather_state_dict`` to export a serial model).
"""
import json
import os
from pathlib import Path

import numpy as np

from . import __version__
from . import distributed as dist
from . import random as sn_random
from .errors import CheckpointError

FORMAT = 1
LATEST = "latest"


def _h5py():
    import h5py  # noqa: PLC0415 - 0.1 s to import: on first save or load only
    return h5py


def _unwrap(model):
    """The module inside a DataParallel (its state is the model's state)."""
    return getattr(model, "module", model)


def _layout(comm, mesh):
    tp = mesh.tp.Get_size() if mesh is not None else 1
    pp = mesh.pp.Get_size() if mesh is not None else 1
    return {"size": comm.Get_size(), "tp": tp, "pp": pp}


# -- writing ------------------------------------------------------------------------
def save_checkpoint(path, model, optimizer=None, *, sampler=None, step=0, keep=3, comm=None,
                    mesh=None, **extra):
    """Save a checkpoint collectively (every rank calls it); returns its path.

    ``sampler`` (a DistributedSampler) saves its epoch and position; ``extra``
    values must be JSON-serialisable (e.g. a scheduler's state_dict)."""
    comm = dist.comm_or_default(comm)
    rng_states = comm.gather(sn_random.get_rng_state(), root=0)
    sharded = _is_sharded(mesh)
    states = _local_states(model, optimizer)
    states = comm.gather(states, root=0) if sharded else [states]
    target, directory = _target(path, step)
    error = None
    if comm.Get_rank() == 0:
        meta = {"format": FORMAT, "version": __version__, "step": int(step),
                "layout": _layout(comm, mesh), "rng": rng_states,
                "sampler": sampler.state_dict() if sampler is not None else None,
                "extra": extra}
        try:
            json.dumps(extra)
        except TypeError as exc:
            error = f"extra values must be JSON-serialisable: {exc}"
        if error is None:
            error = _write(target, states, meta)
        if error is None and directory is not None:
            _point_latest(directory, target.name)
            _rotate(directory, keep)
    error = comm.bcast(error, root=0)
    if error is not None:
        raise CheckpointError(f"saving checkpoint {target} failed on rank 0: {error}")
    return str(target)


def _target(path, step):
    """(file to write, checkpoint directory or None): a path that is a
    directory or ends with a separator names a rotating directory."""
    is_dir = str(path).endswith(os.sep) or Path(path).is_dir()
    path = Path(path)
    if is_dir:
        path.mkdir(parents=True, exist_ok=True)
        return path / f"ckpt-{int(step):08d}.h5", path
    return path, None


def _is_sharded(mesh):
    return mesh is not None and (mesh.tp.Get_size() > 1 or mesh.pp.Get_size() > 1)


def _local_states(model, optimizer):
    """(model state, optimizer state or None) of this rank (collective for
    optimizers whose state_dict gathers, e.g. ZeroRedundancyOptimizer)."""
    return (_unwrap(model).state_dict(),
            optimizer.state_dict() if optimizer is not None else None)


def _write(target, states, meta):
    """Write temp, fsync, rename, fsync the directory; returns an error string.
    ``states``: one (model, optimizer) pair, or one per rank (sharded)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with _h5py().File(tmp, "w") as f:
            for r, (model_state, opt_state) in enumerate(states):
                group = f if len(states) == 1 else f.create_group(f"rank{r}")
                for name, array in model_state.items():
                    group.create_dataset(f"model/{name}", data=array)
                if opt_state is not None:
                    _write_optimizer(group, opt_state)
            f.attrs["meta"] = json.dumps(meta)
            f.attrs["complete"] = True  # last: a file without it is incomplete
        _fsync(tmp)
        os.replace(tmp, target)
        _fsync(target.parent)
        return None
    except Exception as exc:  # reported on every rank by the caller
        return f"{type(exc).__name__}: {exc}"
    finally:
        if tmp.exists():
            tmp.unlink()


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_optimizer(f, state):
    f.attrs["optimizer_groups"] = json.dumps(state["param_groups"])
    for index, entries in state["state"].items():
        for key, value in entries.items():
            f.create_dataset(f"optimizer/{index}/{key}", data=np.asarray(value))


def _point_latest(directory, name):
    tmp = directory / f".{LATEST}.tmp-{os.getpid()}"
    tmp.write_text(name + "\n")
    _fsync(tmp)
    os.replace(tmp, directory / LATEST)
    _fsync(directory)


def _rotate(directory, keep):
    if keep is None or keep < 1:
        return
    for old in sorted(directory.glob("ckpt-*.h5"))[:-keep]:
        old.unlink()


def latest_checkpoint(directory):
    """The newest complete checkpoint in ``directory``, or None."""
    directory = Path(directory)
    pointer = directory / LATEST
    if pointer.exists():
        candidate = directory / pointer.read_text().strip()
        if candidate.exists():
            return str(candidate)
    found = sorted(directory.glob("ckpt-*.h5")) if directory.is_dir() else []
    return str(found[-1]) if found else None


# -- reading ------------------------------------------------------------------------
def load_checkpoint(path, model, optimizer=None, *, sampler=None, comm=None, mesh=None):
    """Restore a checkpoint on every rank (collectively); returns its ``extra``
    dict with ``step`` added. Raises CheckpointError on every rank when the
    file is missing, incomplete, corrupt or does not fit the model or world."""
    comm = dist.comm_or_default(comm)
    if Path(path).is_dir():
        found = latest_checkpoint(path)
        path = found if found is not None else Path(path) / LATEST
    try:
        meta, model_state, opt_state = _read(path, comm.Get_rank() if _is_sharded(mesh) else None)
        _check_fits(path, meta, model_state, _unwrap(model), comm, mesh)
        error = None
    except CheckpointError as exc:
        error = str(exc)
    errors = comm.allgather(error)
    bad = [(r, e) for r, e in enumerate(errors) if e is not None]
    if bad:
        r, e = bad[0]
        raise CheckpointError(f"rank {r}: {e}")
    steps = comm.allgather(meta["step"])
    if len(set(steps)) != 1:
        raise CheckpointError(f"ranks loaded different steps from {path}: {steps}")
    _unwrap(model).load_state_dict(model_state)
    if optimizer is not None and opt_state is not None:
        optimizer.load_state_dict(opt_state)
    sn_random.set_rng_state(meta["rng"][comm.Get_rank()])
    if sampler is not None and meta["sampler"] is not None:
        sampler.load_state_dict(meta["sampler"])
    return dict(meta["extra"], step=meta["step"])


def _read(path, rank=None):
    """(meta, model state, optimizer state) from the file; ``rank`` selects
    that rank's part of a sharded checkpoint."""
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
            model_state = {name: ds[()] for name, ds in group["model"].items()} \
                if "model" in group else {}
            opt_state = _read_optimizer(group) if "optimizer_groups" in group.attrs else None
    except CheckpointError:
        raise
    except Exception as exc:  # h5py's message says what is wrong with the file
        raise CheckpointError(f"checkpoint {path} is unreadable or corrupt: {exc}") from exc
    return meta, model_state, opt_state


def _read_optimizer(f):
    state = {}
    if "optimizer" in f:
        for index, group in f["optimizer"].items():
            state[int(index)] = {k: _scalar_or_array(v[()]) for k, v in group.items()}
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
