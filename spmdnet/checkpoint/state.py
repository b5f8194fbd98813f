"""What a checkpoint holds of a training run, and putting it back: the model
and optimizer state of this rank (gathered for a sharded model), the world
layout it was written by, and the check that a checkpoint fits a model.

With data parallelism only, every rank holds the same model and optimizer
state and rank 0's is saved. With a ``mesh`` whose tensor- or pipeline-
parallel size is above 1, ranks hold different parts: every rank's state is
gathered to rank 0 and saved under ``rank<r>/``, and only the same tp and pp
can load it, at any data-parallel size (``resharding``; use
``parallel.gather_state_dict`` to export a serial model). An FSDP model
saves its full state and ``fsdp.optim_state_dict`` (every rank's optimizer
shards gathered, keyed by parameter name); loading shards them for the
loading job's world size.
"""
import numpy as np

from ..errors import CheckpointError
from . import resharding


def unwrap(model):
    """The module inside a DataParallel (its state is the model's state)."""
    return getattr(model, "module", model)


def is_fsdp(model):
    """A FullyShardedDataParallel model: its optimizer state is gathered by name."""
    return hasattr(model, "optim_state_dict") and hasattr(model, "load_optim_state_dict")


def is_sharded(mesh):
    """Whether ranks hold different parts of the model (tensor or pipeline parallel)."""
    return mesh is not None and (mesh.tp.Get_size() > 1 or mesh.pp.Get_size() > 1)


def layout(comm, mesh):
    """The world layout a checkpoint is written by and must be loaded by."""
    tp = mesh.tp.Get_size() if mesh is not None else 1
    pp = mesh.pp.Get_size() if mesh is not None else 1
    return {"size": comm.Get_size(), "tp": tp, "pp": pp}


def local_states(model, optimizer):
    """(model state, optimizer state or None) of this rank. Collective for
    optimizers whose state_dict gathers (ZeroRedundancyOptimizer) and for
    FSDP, whose optimizer state is every rank's shards, keyed by name."""
    # host copies: state_dict() shares the parameters' memory, and a saved
    # state must not change when training goes on (or the file is written later)
    model_state = {k: t.numpy() for k, t in unwrap(model).state_dict().items()}
    if optimizer is None:
        return model_state, None
    if is_fsdp(model):
        return model_state, model.optim_state_dict(optimizer)
    return model_state, optimizer.state_dict()


def parameter_names(model, optimizer):
    """{optimizer state index: parameter name} (``#i`` where unknown), to name
    the parameter whose optimizer state holds NaN."""
    if optimizer is None:
        return {}
    if is_fsdp(model):  # the optimizer state is keyed by name already
        return {name: name for flat in model.flats() for name in flat.names}
    names = {id(p): name for name, p in unwrap(model).named_parameters()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return {i: names.get(id(p), f"#{i}") for i, p in enumerate(params)}


def check_fits(path, meta, model_state, model, comm, mesh):
    """Raise CheckpointError unless the checkpoint was written with this
    job's tp and pp (any data-parallel size: ``resharding``) and holds
    exactly the model's names and shapes."""
    step = meta.get("step")
    resharding.check_layout(path, meta, comm, mesh)
    own = unwrap(model).state_dict()
    saved = {name: np.shape(value) for name, value in model_state.items()}
    missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    shapes = [f"{k}: checkpoint {saved[k]} vs model {own[k].shape}" for k in own
              if k in saved and tuple(saved[k]) != own[k].shape]
    if missing or unexpected or shapes:
        raise CheckpointError(f"checkpoint {path} (step {step}) does not fit the model: "
                              f"missing {missing}, unexpected {unexpected}, shapes {shapes}")


def restore(path, model, optimizer, model_state, optimizer_state):
    """Load the states into the model and the optimizer (FSDP: this rank's slices)."""
    by_name = optimizer_state is not None and all(
        isinstance(p, str) for g in optimizer_state["param_groups"] for p in g["params"])
    if optimizer is not None and optimizer_state is not None and is_fsdp(model) and not by_name:
        raise CheckpointError(f"{path}: optimizer state not saved from an FSDP model")
    unwrap(model).load_state_dict(model_state)
    if optimizer is None or optimizer_state is None:
        return
    if is_fsdp(model):
        model.load_optim_state_dict(optimizer, optimizer_state)
    else:
        optimizer.load_state_dict(optimizer_state)
