"""``torch.distributed.checkpoint.state_dict``: one way to save and load a
model's and its optimizers' state, whatever wraps the model.

Models: plain modules, ``DistributedDataParallel`` (keys without
``module.``), ``FullyShardedDataParallel`` (the full state only: its sharded
state raises NotImplementedError) and models with ``fully_shard``-ed parts,
whose parameters are DTensors: ``full_state_dict=True`` gathers them into
full Tensors (a collective), else the state holds DTensor shards.

Optimizer states are keyed by parameter names (PyTorch's layout):
``{"state": {name: {key: value}}, "param_groups": [{..., "params":
[names]}]}``. ``flatten_optimizer_state_dict=True`` and ``submodules=``
raise NotImplementedError.
"""
import dataclasses

import numpy as np

from ..._tensor import Tensor
from ...optim.optimizer import Optimizer
from ..tensor._api import DTensor
from . import _layout


@dataclasses.dataclass
class StateDictOptions:
    """PyTorch's options (see the module docstring and the functions)."""
    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False
    dsd_fqn_modifiers: str = "_fqn_modifiers"


def _options(options, submodules=None):
    opts = options if options is not None else StateDictOptions()
    if not isinstance(opts, StateDictOptions):
        raise TypeError(f"options must be a StateDictOptions, got {type(opts).__name__}")
    if submodules is not None:
        raise NotImplementedError("get_*_state_dict(submodules=...) is not supported by "
                                  "spmdnet: take the submodule's own state")
    if opts.flatten_optimizer_state_dict:
        raise NotImplementedError("StateDictOptions(flatten_optimizer_state_dict=True) is "
                                  "not supported by spmdnet")
    if opts.broadcast_from_rank0 and not opts.full_state_dict:
        raise ValueError("StateDictOptions(broadcast_from_rank0=True) needs "
                         "full_state_dict=True (rank 0 holds the full state)")
    return opts


def _fsdp1_full(opts, what):
    if not opts.full_state_dict:
        raise NotImplementedError(f"{what} of a FullyShardedDataParallel model: spmdnet "
                                  "gives its full state only (full_state_dict=True)")


def _optimizers(optimizers):
    opts = [optimizers] if isinstance(optimizers, Optimizer) else list(optimizers)
    if not opts or not all(isinstance(o, Optimizer) for o in opts):
        raise TypeError(f"optimizers must be an Optimizer or a list of them, got {optimizers!r}")
    return opts


def get_model_state_dict(model, *, submodules=None, options=None):
    """The model's state with the plain model's keys (see the module docstring)."""
    opts = _options(options, submodules)
    kind, module = _layout.unwrap(model)
    if kind == "fsdp1":
        _fsdp1_full(opts, "get_model_state_dict")
        state = dict(model.state_dict())
        frozen = {n for n, p in module.module.named_parameters() if not p.requires_grad}
    else:
        state = {}
        for key, value in module.state_dict(keep_vars=True).items():
            if isinstance(value, DTensor):
                state[key] = _layout.shard_value(value, value.array, opts.full_state_dict)
            else:
                state[key] = value.detach()
        frozen = {n for n, p in module.named_parameters() if not p.requires_grad}
    if opts.ignore_frozen_params:
        state = {k: v for k, v in state.items() if k not in frozen}
    return _layout.offload(state, opts.full_state_dict) if opts.cpu_offload else state


def set_model_state_dict(model, model_state_dict, *, options=None):
    """Load a state from ``get_model_state_dict`` (full or sharded);
    returns ``(missing_keys, unexpected_keys)`` as ``load_state_dict``."""
    opts = _options(options)
    if opts.broadcast_from_rank0:
        model_state_dict = _layout.from_rank0(model_state_dict)
    kind, module = _layout.unwrap(model)
    if kind == "fsdp1":
        _fsdp1_full(opts, "set_model_state_dict")
        return model.load_state_dict(model_state_dict, strict=opts.strict)
    targets = module.state_dict(keep_vars=True)
    local = {}
    for key, value in model_state_dict.items():
        like = targets.get(key)
        local[key] = _layout.local_value(like, value) if isinstance(like, DTensor) else value
    return module.load_state_dict(local, strict=opts.strict)


def _merge(states):
    merged = {"state": {}, "param_groups": []}
    for state in states:
        merged["state"].update(state["state"])
        merged["param_groups"].extend(state["param_groups"])
    return merged


def _named_optimizer_state(module, opt, full):
    names = _layout.param_names(module)
    params = [p for g in opt.param_groups for p in g["params"]]
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise ValueError(f"the optimizer's parameters {missing} are not the model's")
    raw = opt.state_dict()
    state = {}
    for index, entry in raw["state"].items():
        param = params[int(index)]
        state[names[id(param)]] = {
            k: (_layout.shard_value(param, v, full) if isinstance(param, DTensor)
                and np.ndim(v) > 0 else Tensor(v) if np.ndim(v) > 0 else v)
            for k, v in entry.items()}
    groups = [{**{k: v for k, v in g.items() if k != "params"},
               "params": [names[id(params[i])] for i in g["params"]]}
              for g in raw["param_groups"]]
    return {"state": state, "param_groups": groups}


def get_optimizer_state_dict(model, optimizers, *, submodules=None, options=None):
    """The optimizers' state keyed by parameter names (one dict for all)."""
    opts = _options(options, submodules)
    kind, module = _layout.unwrap(model)
    if kind == "fsdp1":
        _fsdp1_full(opts, "get_optimizer_state_dict")
        state = _merge([model.optim_state_dict(o) for o in _optimizers(optimizers)])
    else:
        state = _merge([_named_optimizer_state(module, o, opts.full_state_dict)
                        for o in _optimizers(optimizers)])
    if opts.cpu_offload:
        return _layout.offload(state, opts.full_state_dict)
    return state


def _indexed_optimizer_state(module, opt, named):
    names = _layout.param_names(module)
    params = [p for g in opt.param_groups for p in g["params"]]
    state = {}
    for index, param in enumerate(params):
        entry = named["state"].get(names[id(param)])
        if entry is None:
            continue
        state[index] = {
            k: (_layout.local_value(param, v) if isinstance(param, DTensor)
                and np.ndim(_layout.as_array(v)) > 0 else _layout.as_array(v))
            for k, v in entry.items()}
    by_name = {n: i for i, n in ((i, names[id(p)]) for i, p in enumerate(params))}
    groups = []
    for group in _groups_for(opt, named, names):
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": [by_name[n] for n in group["params"]]})
    return {"state": state, "param_groups": groups}


def _groups_for(opt, named, names):
    """The saved groups holding ``opt``'s parameters, in ``opt``'s order."""
    own = [{names[id(p)] for p in g["params"]} for g in opt.param_groups]
    found = []
    for mine in own:
        match = [g for g in named["param_groups"] if set(g["params"]) == mine]
        if not match:
            raise ValueError(f"no saved parameter group holds exactly {sorted(mine)}")
        found.append(match[0])
    return found


def set_optimizer_state_dict(model, optimizers, optim_state_dict, *, options=None):
    """Load a state from ``get_optimizer_state_dict`` into the optimizers."""
    opts = _options(options)
    if opts.broadcast_from_rank0:
        optim_state_dict = _layout.from_rank0(optim_state_dict)
    kind, module = _layout.unwrap(model)
    for opt in _optimizers(optimizers):
        if kind == "fsdp1":
            _fsdp1_full(opts, "set_optimizer_state_dict")
            model.load_optim_state_dict(opt, optim_state_dict)
        else:
            opt.load_state_dict(_indexed_optimizer_state(module, opt, optim_state_dict))


def get_state_dict(model, optimizers, *, submodules=None, options=None):
    """``(get_model_state_dict(...), get_optimizer_state_dict(...))``."""
    return (get_model_state_dict(model, submodules=submodules, options=options),
            get_optimizer_state_dict(model, optimizers, submodules=submodules,
                                     options=options))


def set_state_dict(model, optimizers, *, model_state_dict, optim_state_dict, options=None):
    """Load both; returns the model's ``(missing_keys, unexpected_keys)``."""
    result = set_model_state_dict(model, model_state_dict, options=options)
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return result


__all__ = ["StateDictOptions", "get_model_state_dict", "set_model_state_dict",
           "get_optimizer_state_dict", "set_optimizer_state_dict", "get_state_dict",
           "set_state_dict"]
