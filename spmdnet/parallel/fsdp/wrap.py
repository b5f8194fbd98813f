"""Where each parameter of a FullyShardedDataParallel model goes: its unit
(the wrap policy) and, inside the unit, its flat shard (dtype and optimizer
options, the ``param_groups`` function).

``owners`` walks the model: a module the policy wraps starts a unit, the
rest belongs to the enclosing unit (the root ""). ``split_flats`` makes one
``Flat`` per dtype and distinct options dict among a unit's parameters, so
minGPT's groups (decay on the matrices, none on biases and LayerNorm) are
separate shards, each padded to the group size. ``optimizer_groups`` builds
the optimizer's ``[{"params": shards, **options}]``.
"""
from .units import Flat


def policy(wrap):
    if wrap is None:
        return lambda m: False
    if callable(wrap) and not isinstance(wrap, type):
        return wrap
    classes = (wrap,) if isinstance(wrap, type) else tuple(wrap)
    return lambda m: isinstance(m, classes)


def owners(model, policy):
    """{unit module name: [(param name, param)]} for the root ("") and each wrapped module."""
    units, owner_of = {"": (model, [])}, {}
    stack = [("", model, "")]
    while stack:
        name, mod, unit = stack.pop()
        if name and policy(mod):
            unit = name
            units[unit] = (mod, [])
        for pname, p in mod._parameters.items():
            if p is None or not p.requires_grad:
                continue
            full = f"{name}.{pname}" if name else pname
            if id(p) in owner_of:
                if owner_of[id(p)] != unit:
                    raise ValueError(f"FSDP: parameter {full!r} is shared by units "
                                     f"{owner_of[id(p)]!r} and {unit!r}; tie parameters "
                                     "inside one unit (wrap their common parent)")
                continue
            owner_of[id(p)] = unit
            units[unit][1].append((full, p))
        for cname, child in reversed(list(mod._modules.items())):
            if child is not None:
                stack.append((f"{name}.{cname}" if name else cname, child, unit))
    return units


def split_flats(params, fn, comm, **shared):
    """One flat per dtype and options dict ``fn(name, p)`` among a unit's
    ``[(name, param)]``, in order of first appearance (usually one);
    ``shared``: the ``Flat`` arguments every flat of the model takes (its
    source and pool)."""
    groups = {}
    for name, p in params:
        opts = options(fn, name, tuple(p.shape), p.dtype)
        groups.setdefault((str(p.dtype), _key(opts)), (opts, []))[1].append((name, p))
    flats = []
    for opts, group in groups.values():
        flats.append(Flat([n for n, _ in group], [p for _, p in group], comm, opts, **shared))
    return flats


def optimizer_groups(flats, fn=None):
    """``[{"params": shards, **options}]`` by each flat's options, or by
    ``fn``; ValueError when ``fn`` gives one flat's parameters different options."""
    groups = {}
    for f in flats:
        opts = [f.options] if fn is None else [
            options(fn, n, s, f.dtype) for n, s in zip(f.names, f.shapes)]
        if any(o != opts[0] for o in opts):
            table = ", ".join(f"{n}: {o}" for n, o in zip(f.names, opts))
            raise ValueError("FSDP.param_groups: one flat shard holds parameters with "
                             f"different options ({table}); pass the function as "
                             "FullyShardedDataParallel(..., param_groups=fn) to split "
                             "each unit's flat shard by options")
        groups.setdefault(_key(opts[0]), (opts[0], []))[1].append(f.shard)
    return [{"params": shards, **opts} for opts, shards in groups.values()]


class _Shape:
    """What ``param_groups``' function sees of a parameter: its shape and dtype."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype, self.ndim = shape, dtype, len(shape)

    def dim(self):
        return self.ndim


def options(fn, name, shape, dtype):
    """The options dict ``fn`` gives parameter ``name`` ({} without ``fn``)."""
    return {} if fn is None else dict(fn(name, _Shape(shape, dtype)) or {})


def _key(opts):
    """A hashable key of an options dict (its values may be lists)."""
    return repr(sorted(opts.items()))
