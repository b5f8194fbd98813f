"""``fully_shard`` (PyTorch's FSDP2): per-parameter sharding over a
DeviceMesh, applied bottom-up to blocks and then the root.

``fully_shard(module)`` replaces each parameter the module owns (those not
already held by a ``fully_shard``-ed submodule, nor in ``ignored_params``)
by a ``DTensor`` holding this rank's ``Shard(0)`` piece (``torch.chunk``'s
pieces, so uneven sizes leave the last ranks fewer rows), and changes the
module's class in place to a subclass of ``(FSDPModule, its class)``.
Optimizers built afterwards from ``model.parameters()`` step on the shards.

- Forward and backward (``_fsdp_state``): a pre-hook all-gathers the unit's
  parameters into its storage and registers full Parameters over it
  (``unshard``); a post-hook, when ``reshard_after_forward`` (None: every
  unit but the root, as PyTorch; always under ``no_grad``), releases the
  storage and registers the shards (``reshard``); before the unit's
  backward its parameters are all-gathered again into the same storage, so
  between forward and backward a rank holds its shards and the root's full
  parameters. An int ``k`` keeps each rank's piece of a group of ``k``
  ranks after forward and gathers from that group in backward (as PyTorch:
  1 is False, the shard dimension's size is True).
- Gradients (``_fsdp_grads``, on the ``ParamAndGradBuffer`` of DataParallel,
  ZeRO and FSDP1): once a unit's gradients are final its reduce-scatter
  starts, completed when backward ends, the mean over the mesh added into
  the shards' ``.grad``. With ``set_requires_gradient_sync(False)`` nothing
  is communicated: the full gradients accumulate in the buffer until a
  synchronising backward reduces the sum.
- ``mesh``: 1-D (shard over it), or 2-D (replicate, shard) for HSDP: shards
  over the second dimension, gradients also averaged over the first; the
  shards are DTensors with placements ``(Replicate(), Shard(0))``.
- ``MixedPrecisionPolicy``: see ``_fsdp_api``. ``CPUOffloadPolicy``: the
  shards (and so their gradients and the optimizer's step) stay on the host
  (NumPy arrays, page-locked with ``pin_memory`` when they came from a GPU);
  each gather copies them to the compute device first. On the CPU backend
  parameters already live on the host, so it places nothing elsewhere.
"""
import functools
import weakref

from ...backend import device_of
from ...dtypes import is_floating
from .. import c10d, runtime
from ..device_mesh import DeviceMesh, init_device_mesh
from ..tensor._api import DTensor, local_piece
from ..tensor._placements import Replicate, Shard
from ._fsdp_api import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from ._fsdp_grads import check_reducible
from ._fsdp_state import Entry, FSDPState, map_tensors
from ._fsdp_storage import host_copy

_active = {"depth": 0}  # fully_shard forwards now running: 0 at the root's entry
_classes = {}
_sharded = {}  # id -> weakref of the parameters replaced by shards (the check for ties)


class FSDPModule:
    """The mixin ``fully_shard`` adds to a module's class."""

    def unshard(self, async_op=False):
        """All-gather this unit's parameters into the module (blocking, so
        ``async_op=True`` returns a handle whose ``wait()`` has nothing left)."""
        self._fsdp_state.unshard()
        return _DoneHandle() if async_op else None

    def reshard(self):
        """Register the shards again in place of the full parameters, whose
        storage is released."""
        self._fsdp_state.reshard()

    def set_requires_gradient_sync(self, requires_gradient_sync, *, recurse=True):
        """False: backward accumulates full gradients without communication."""
        for state in _states(self, recurse):
            state.sync = bool(requires_gradient_sync)

    def set_reshard_after_forward(self, reshard_after_forward, recurse=True):
        if not isinstance(reshard_after_forward, bool):
            raise ValueError(f"reshard_after_forward should be a bool, got "
                             f"{type(reshard_after_forward).__name__}")
        for state in _states(self, recurse):
            state.reshard_after_forward = reshard_after_forward


class _DoneHandle:
    def wait(self):
        return None


def _states(module, recurse):
    modules = module.modules() if recurse else [module]
    return [m._fsdp_state for m in modules if isinstance(m, FSDPModule)]


def _forget(ref, key):
    if _sharded.get(key) is ref:
        del _sharded[key]


def _cast(value, dtype):
    """Floating tensors in ``value`` (nested tuples/lists/dicts) cast to ``dtype``."""
    def cast(t):
        kind = t.array.dtype
        return t.to(dtype) if is_floating(kind) and kind != dtype else t
    return map_tensors(value, cast)


def _pre_forward(module, args, kwargs):
    state = module._fsdp_state
    root = _active["depth"] == 0
    _active["depth"] += 1
    if state.mp.param_dtype is not None and state.mp.cast_forward_inputs:
        args, kwargs = _cast(args, state.mp.param_dtype), _cast(kwargs, state.mp.param_dtype)
    state.pre_forward(args, kwargs, root)
    return args, kwargs


def _post_forward(module, args, output):
    state = module._fsdp_state
    _active["depth"] -= 1
    output = state.post_forward(output)
    if state.mp.output_dtype is not None:
        output = _cast(output, state.mp.output_dtype)
    return output


def _managed(module, ignored):
    """{id: (parameter, [(owner, name), ...])} of the parameters ``module``
    shards: its own and its submodules', except those under a fully_shard-ed
    submodule; a tied parameter once, with all its slots."""
    found, skip = {}, set(id(p) for p in ignored)
    stack = [module]
    while stack:
        m = stack.pop()
        for name, p in m._parameters.items():
            if p is None or id(p) in skip or isinstance(p, DTensor):
                continue
            if id(p) in _sharded and _sharded[id(p)]() is p:
                raise NotImplementedError(
                    f"fully_shard({type(module).__name__}): parameter {name!r} of "
                    f"{type(m).__name__} is shared with an already fully_shard-ed submodule;"
                    " apply fully_shard to a module that holds every use of it")
            found.setdefault(id(p), (p, []))[1].append((m, name))
        stack.extend(c for c in reversed(list(m._modules.values()))
                     if c is not None and not isinstance(c, FSDPModule))
    return found


def _check(mesh, mp_policy, offload_policy):
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"fully_shard(mesh=...) expects a DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim not in (1, 2):
        raise ValueError(f"fully_shard: a 1-D mesh (FSDP) or a 2-D (replicate, shard) mesh "
                         f"(HSDP) is needed, got a {mesh.ndim}-D mesh {mesh!r}")
    if mesh.get_coordinate() is None:
        raise ValueError(f"fully_shard: rank {runtime.world().rank} is not in {mesh!r}")
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"mp_policy must be a MixedPrecisionPolicy, got {mp_policy!r}")
    reduce_dtype = mp_policy.param_dtype if mp_policy.reduce_dtype is None \
        else mp_policy.reduce_dtype
    if reduce_dtype is not None:
        check_reducible(reduce_dtype, f"with {mp_policy!r} the gradients")
    if not isinstance(offload_policy, OffloadPolicy):
        raise TypeError(f"offload_policy must be an OffloadPolicy, got {offload_policy!r}")


def _reshard_plan(mesh, reshard_after_forward):
    """(reshard_after_forward as True/False/None, the process group a rank
    gathers from in backward when it keeps pieces after forward). An int k,
    as PyTorch: 1 keeps the parameters unsharded (False), the shard group's
    size reshards them fully (True), another factor k of it keeps each
    rank's piece among its k consecutive ranks of the shard group."""
    k = reshard_after_forward
    if k is None or isinstance(k, bool):
        return k, None
    size = mesh.size(mesh.ndim - 1)
    if not isinstance(k, int) or k < 1 or size % k:
        raise ValueError(f"If passing reshard_after_forward as an int, it should be a factor "
                         f"of {size} (the shard dimension's size of {mesh!r}), not {k!r}")
    if k in (1, size):
        return k != 1, None
    mine = None
    for line in mesh.mesh.reshape(-1, size):  # every shard group, in the mesh's row order
        for start in range(0, size, k):  # new_group is collective: every rank makes each
            ranks = [int(r) for r in line[start:start + k]]
            group = c10d.new_group(ranks)
            if runtime.world().rank in ranks:
                mine = group
    return k, mine


def _shard(param, mesh, placement):
    if param.array.ndim == 0:
        raise ValueError("fully_shard: a 0-dimensional parameter cannot be sharded")
    placement = Shard(0) if placement is None else placement
    if not isinstance(placement, Shard):
        raise NotImplementedError(f"shard_placement_fn returned {placement!r}: spmdnet "
                                  "shards with Shard(dim)")
    placements = (Replicate(),) * (mesh.ndim - 1) + (Shard(placement.dim),)
    local, placements = local_piece(param.array, mesh, placements)
    return DTensor(local, mesh, placements, param.array.shape, param.requires_grad)


def fully_shard(module, *, mesh=None, reshard_after_forward=None, shard_placement_fn=None,
                mp_policy=MixedPrecisionPolicy(), offload_policy=OffloadPolicy(),  # noqa: B008
                ignored_params=None, dp_mesh_dims=None):
    """Shard ``module``'s parameters over ``mesh`` (default: all ranks) and
    make it an FSDPModule; returns the module (see the module docstring)."""
    if dp_mesh_dims is not None:
        raise NotImplementedError(f"fully_shard(dp_mesh_dims={dp_mesh_dims!r}) is not "
                                  "supported by spmdnet")
    if isinstance(module, (list, tuple)):
        raise NotImplementedError("fully_shard of a list of modules is not supported by "
                                  "spmdnet: shard each module")
    if mesh is None:
        if not c10d.is_initialized():
            c10d.init_process_group()
        mesh = init_device_mesh("cpu", (runtime.world().size,))
    _check(mesh, mp_policy, offload_policy)
    if isinstance(module, FSDPModule):
        raise ValueError(f"fully_shard was already applied to {type(module).__name__}")
    reshard_after_forward, kept = _reshard_plan(mesh, reshard_after_forward)
    entries, devices = [], set()
    for param, slots in _managed(module, ignored_params or ()).values():
        placement = shard_placement_fn(param) if shard_placement_fn is not None else None
        shard = _shard(param, mesh, placement)
        devices.add(device_of(shard.array))
        if isinstance(offload_policy, CPUOffloadPolicy):
            shard.array = host_copy(shard.array, offload_policy.pin_memory)
        entry = Entry(slots, shard, shard.placements[-1].dim)
        entry.register(entry.shard)
        entries.append(entry)
        _sharded[id(param)] = weakref.ref(param, functools.partial(_forget, key=id(param)))
    if len(devices) > 1:
        raise ValueError(f"fully_shard({type(module).__name__}): parameters on several "
                         f"devices {sorted(devices)}; move the module to one device first")
    replicate = mesh.get_group(0) if mesh.ndim == 2 else None
    state = FSDPState(module, entries, devices.pop() if devices else "cpu",
                      mesh.get_group(mesh.ndim - 1).comm,
                      None if replicate is None else replicate.comm,
                      None if kept is None else kept.comm, reshard_after_forward, mp_policy)
    module.__dict__["_fsdp_state"] = state
    module.register_forward_pre_hook(_pre_forward, prepend=True, with_kwargs=True)
    module.register_forward_hook(_post_forward)
    cls = type(module)
    if cls not in _classes:
        _classes[cls] = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    object.__setattr__(module, "__class__", _classes[cls])
    return module


__all__ = ["fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy",
           "CPUOffloadPolicy"]
