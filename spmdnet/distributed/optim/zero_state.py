"""Full (unsharded) optimizer state of a ZeroRedundancyOptimizer.

Inside, the wrapped optimizer has one parameter per group: the group's part
of this rank's shard of the flat buffer (``zo.segments``). Outside, the state
is laid out like that optimizer's own ``state_dict`` over the original
parameters: indices counted across the groups, per-parameter arrays in the
parameters' shapes, the groups' options. Each array-valued state key is
assembled into one shard-sized array (every group writing its segment) and
all-gathered once into the full flat layout.
"""
import numpy as np

from ... import distributed as dist


def full_state_dict(zo):
    """The full state (collective: every rank calls it)."""
    inner = zo.optim.state_dict()
    with dist.guarded("broadcast(optimizer state keys)", zo.comm):
        keys = zo.comm.bcast([sorted(inner["state"].get(g, {}))
                              for g in range(len(zo.groups))], root=0)
    flat = {}
    for key in sorted({k for ks in keys for k in ks}):
        shard = None
        for g, (a, b) in enumerate(zo.segments):
            value = inner["state"].get(g, {}).get(key)
            if key not in keys[g] or np.ndim(value) == 0:
                continue
            if shard is None:
                shard = np.zeros(zo.layout.shard_numel, dtype=value.dtype)
            shard[a - zo.lo:b - zo.lo] = value
        if shard is not None:
            flat[key] = dist.allgather(shard, comm=zo.comm).reshape(-1)
    views = {k: zo.layout.views(full) for k, full in flat.items()}
    state, groups, index = {}, [], 0  # index: the parameter's place in zo.params
    for g, group in enumerate(zo.groups):
        entries = inner["state"].get(g, {})
        for _ in group["params"]:
            if keys[g]:
                state[index] = {k: (views[k][index].copy()
                                    if k in flat and np.ndim(entries[k]) else entries[k])
                                for k in keys[g]}
            index += 1
        groups.append(dict(inner["param_groups"][g],
                           params=list(range(index - len(group["params"]), index))))
    return {"state": state, "param_groups": groups}


def load_full_state_dict(zo, state_dict):
    """Load a full state: each rank keeps its segments of it."""
    saved = state_dict["param_groups"]
    if [len(g["params"]) for g in saved] != [len(g["params"]) for g in zo.groups]:
        raise ValueError(f"state_dict has parameter groups of sizes "
                         f"{[len(g['params']) for g in saved]}; this optimizer has "
                         f"{[len(g['params']) for g in zo.groups]}")
    entries, inner_state = state_dict["state"], {}
    first_index = 0  # the place in zo.params of the group's first parameter
    for g, (group, (a, b)) in enumerate(zip(zo.groups, zo.segments)):
        places = range(first_index, first_index + len(group["params"]))
        first_index += len(group["params"])
        indices = saved[g]["params"]
        if not indices or indices[0] not in entries:
            continue
        shard = {}
        for key, first in entries[indices[0]].items():
            if np.ndim(first) == 0:
                shard[key] = first
                continue
            full = np.zeros(zo.flat.size, dtype=np.asarray(first).dtype)
            views = zo.layout.views(full)
            for i, place in zip(indices, places):
                views[place][...] = np.asarray(entries[i][key]).reshape(views[place].shape)
            shard[key] = full[a:b]
        inner_state[g] = shard
    zo.optim.load_state_dict({"state": inner_state,
                              "param_groups": [dict(sg, params=[g])
                                               for g, sg in enumerate(saved)]})
