"""The checkpoint file: one HDF5 file, every array with its checksum.

Layout: ``model/<name>`` datasets (the model's state_dict), the optimizer's
state as ``optimizer/<index or name>/<key>`` datasets with its param_groups
as the JSON attribute ``optimizer_groups``, and the JSON attribute ``meta``
(format, version, step, world layout, RNG states, sampler/loader/scheduler
state, ``extra``). A sharded checkpoint (tensor or pipeline parallel) holds
one such group per rank, ``rank<r>/``, with the JSON attribute
``model_names`` (its model state's names): a file missing any rank's part,
or any array of one, is damaged. The attribute ``complete`` is set last: a
file without it is incomplete.
"""
import functools
import io
import json
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from . import integrity

FORMAT = 1


def _h5py():
    import h5py  # noqa: PLC0415 - 0.1 s to import: on first save or load only
    return h5py


# -- writing ------------------------------------------------------------------------
def file_image(states, meta):
    """The whole file, built in memory (so that HDF5 never sees an I/O error:
    ``files.write_bytes`` reports a full disk cleanly). ``states``: one
    (model state, optimizer state or None) pair, or one per rank (sharded)."""
    image = io.BytesIO()
    with _h5py().File(image, "w") as f:
        for r, (model_state, optimizer_state) in enumerate(states):
            group = f if len(states) == 1 else f.create_group(f"rank{r}")
            if len(states) > 1:
                group.attrs["model_names"] = json.dumps(sorted(model_state))
            for name, array in model_state.items():
                put(group, f"model/{name}", array)
            if optimizer_state is not None:
                write_optimizer(group, optimizer_state)
        f.attrs["meta"] = json.dumps(meta)
        f.attrs["complete"] = True  # last: a file without it is incomplete
    return image.getbuffer()


def put(group, name, array):
    """One array and its checksum (verified by ``get``)."""
    array = np.asarray(array)
    group.create_dataset(name, data=array).attrs["checksum"] = integrity.checksum(array)


def write_optimizer(group, state):
    """An optimizer's state_dict: its tensors as datasets, its groups as JSON."""
    group.attrs["optimizer_groups"] = json.dumps(state["param_groups"])
    by_name = any(isinstance(p, str) for g in state["param_groups"] for p in g["params"])
    group.attrs["optimizer_by_name"] = by_name  # FSDP's state is keyed by parameter name
    for index, entries in state["state"].items():
        for key, value in entries.items():
            put(group, f"optimizer/{index}/{key}", value)


# -- reading ------------------------------------------------------------------------
def read(path, rank=None, allow_nonfinite=False):
    """(meta, model state, optimizer state or None) from the file, every array
    checked against its checksum; ``rank`` selects that rank's part of a
    sharded checkpoint, or is a function of (meta, path) returning the part
    (None: the root) or raising (``resharding.part_selector``). A sharded
    file missing any rank's part is damaged. Raises CheckpointError saying
    what is wrong."""
    if not Path(path).exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        with _h5py().File(path, "r") as f:
            return _read_open_file(f, path, rank, allow_nonfinite)
    except CheckpointError:
        raise
    except Exception as exc:  # h5py's message says what is wrong with the file
        raise CheckpointError(f"checkpoint {path} is unreadable or corrupt: {exc}") from exc


def read_every_part(path, allow_nonfinite=False):
    """``read(path)``, and every rank's part of a sharded checkpoint verified
    too (its root holds no model state): a damaged part fails the whole file."""
    contents = read(path, allow_nonfinite=allow_nonfinite)
    try:
        with _h5py().File(path, "r") as f:
            parts = sorted(int(k[4:]) for k in f if k.startswith("rank") and k[4:].isdigit())
            for rank in parts:
                _read_open_file(f, path, rank, allow_nonfinite)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable or corrupt: {exc}") from exc
    return contents


def _read_open_file(f, path, rank, allow_nonfinite):
    if not f.attrs.get("complete", False) or "meta" not in f.attrs:
        raise CheckpointError(f"checkpoint {path} is incomplete (no completion mark)")
    meta = json.loads(f.attrs["meta"])
    if callable(rank):
        rank = rank(meta, path)
    _check_every_part(f, path, meta)
    group = f if rank is None else f.get(f"rank{rank}")
    if group is None:
        raise CheckpointError(f"checkpoint {path} holds no state for rank {rank}")
    checked = functools.partial(get, path=path, allow_nonfinite=allow_nonfinite)
    model_state = {}
    if "model" in group:
        model_state = {name: checked(ds) for name, ds in group["model"].items()}
    optimizer_state = None
    if "optimizer_groups" in group.attrs:
        optimizer_state = read_optimizer(group, checked)
    return meta, model_state, optimizer_state


def _check_every_part(f, path, meta):
    """CheckpointError unless a sharded file holds the part of every rank
    of its layout, each with every model array its ``model_names`` lists
    (files written before ``model_names`` are checked for the parts only)."""
    layout = meta.get("layout") or {}
    if layout.get("tp", 1) * layout.get("pp", 1) == 1:
        return
    size = int(layout.get("size", 0))
    missing = [r for r in range(size) if f"rank{r}" not in f]
    if missing:
        raise CheckpointError(f"checkpoint {path} is damaged: it holds no part for ranks "
                              f"{missing} of the {size} that wrote it")
    for r in range(size):
        group = f[f"rank{r}"]
        names = json.loads(group.attrs.get("model_names", "[]"))
        absent = [n for n in names if "model" not in group or n not in group["model"]]
        if absent:
            raise CheckpointError(f"checkpoint {path} is damaged: the part of rank {r} lacks "
                                  f"the arrays {absent[:4]}"
                                  + (f" and {len(absent) - 4} more" if len(absent) > 4 else ""))


def get(ds, path, allow_nonfinite):
    """A dataset's array, checked against its checksum (files written before
    checksums have none) and, unless allowed, for NaN/Inf."""
    value = ds[()]
    stored = ds.attrs.get("checksum")
    if stored is not None and integrity.checksum(value) != stored:
        raise CheckpointError(f"checkpoint {path} is corrupt: array {ds.name} does not match "
                              "the checksum written with it")
    nonfinite = 0 if allow_nonfinite else integrity.count_nonfinite(value)
    if nonfinite:
        raise CheckpointError(f"checkpoint {path}: array {ds.name} holds {nonfinite} NaN/Inf "
                              "values (load with allow_nonfinite=True to accept them)")
    return value


def read_optimizer(group, checked):
    """The optimizer's state_dict as ``write_optimizer`` wrote it."""
    key = str if group.attrs.get("optimizer_by_name", False) else int
    state = {}
    if "optimizer" in group:
        for index, entries in group["optimizer"].items():
            state[key(index)] = {k: _scalar_or_array(checked(v)) for k, v in entries.items()}
    param_groups = json.loads(group.attrs["optimizer_groups"])
    for param_group in param_groups:  # JSON made tuples (betas) into lists
        for k, v in param_group.items():
            if k != "params" and isinstance(v, list):
                param_group[k] = tuple(v)
    return {"state": state, "param_groups": param_groups}


def _scalar_or_array(value):
    return value.item() if np.ndim(value) == 0 else value
