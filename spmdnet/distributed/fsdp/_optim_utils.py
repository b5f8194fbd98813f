"""Full optimizer state of a FullyShardedDataParallel model, with the original names.

The optimizer updates flat shards, so its state (Adam's moments, SGD's
momentum) is one shard-shaped array per flat and key. ``full_optim_state``
all-gathers each and cuts it into the original parameters' shapes:
``{"state": {param name: {key: array}}, "param_groups": [{..., "params":
[param names]}]}`` (scalars such as ``step`` are repeated per parameter).
``load_full_optim_state`` takes this rank's slices back. Both are
collective: every rank calls them.
"""
import numpy as np

from ...backend import asnumpy


def full_optim_state(flats, opt):
    state = {}
    for f in flats:
        entries = {k: v for k, v in opt.state.get(f.shard, {}).items() if not k.startswith("_")}
        for name in f.names:
            state[name] = {}
        for key in sorted(entries):
            value = entries[key]
            if hasattr(value, "shape") and tuple(value.shape) == tuple(f.shard.shape):
                full = asnumpy(f.allgather(value))
                for name, view in zip(f.names, f.layout.views(full)):
                    state[name][key] = np.array(view, copy=True)
            else:
                for name in f.names:
                    state[name][key] = np.array(asnumpy(value), copy=True) \
                        if hasattr(value, "shape") else value
    names = {id(f.shard): f.names for f in flats}
    groups = [{**{k: v for k, v in g.items() if k != "params"},
               "params": [n for p in g["params"] for n in names[id(p)]]}
              for g in opt.param_groups]
    return {"state": {k: v for k, v in state.items() if v}, "param_groups": groups}


def load_full_optim_state(flats, opt, full):
    """Give ``opt`` this rank's slices of ``full`` (as ``full_optim_state`` returns)."""
    index = {id(p): i for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
    state = {}
    for f in flats:
        if id(f.shard) not in index:
            continue
        saved = [full["state"].get(name) for name in f.names]
        if not any(saved):
            continue
        missing = [n for n, s in zip(f.names, saved) if not s]
        if missing:
            raise KeyError(f"load_optim_state_dict: no state for {missing}, but for other "
                           f"parameters of the same flat shard ({f.names})")
        entry = {}
        for key, first in saved[0].items():
            if np.ndim(first) == 0:
                entry[key] = first
                continue
            flat = f.layout.pack(np.zeros(f.layout.padded_numel, f.dtype),
                                 [np.asarray(s[key]) for s in saved])
            entry[key] = f.layout.shard_of(flat, f.rank)
        state[index[id(f.shard)]] = entry
    groups = [{**{k: v for k, v in sg.items() if k != "params"},
               "params": [index[id(p)] for p in g["params"]]}
              for g, sg in zip(opt.param_groups, full["param_groups"])]
    if len(full["param_groups"]) != len(opt.param_groups):
        raise ValueError(f"load_optim_state_dict: {len(full['param_groups'])} saved parameter "
                         f"groups, the optimizer has {len(opt.param_groups)}")
    opt.load_state_dict({"state": state, "param_groups": groups})
