"""``fully_shard`` (PyTorch's FSDP2): per-parameter sharding over a 1-D
DeviceMesh, applied bottom-up to blocks and then the root.

``fully_shard(module)`` replaces each parameter the module owns (those not
already held by a ``fully_shard``-ed submodule, nor in ``ignored_params``)
by a ``DTensor`` holding this rank's ``Shard(0)`` piece (``torch.chunk``'s
pieces, so uneven sizes leave the last ranks fewer rows), and changes the
module's class in place to a subclass of ``(FSDPModule, its class)``.
Optimizers built afterwards from ``model.parameters()`` step on the shards.

- Forward: a pre-hook all-gathers the unit's parameters into full leaf
  Parameters registered in the module for the forward (``unshard``); a
  post-hook swaps the shards back (``reshard``) when ``reshard_after_forward``
  (None: every unit but the root, as PyTorch; always under ``no_grad``). The
  gathered arrays stay alive while the autograd graph needs them (they are
  not re-gathered in backward) and are dropped after backward.
- Backward: when a full parameter's gradient is final, the unit queues one
  end-of-backward callback that reduce-scatters the gradients (mean over the
  mesh) into the shards' ``.grad`` (accumulating, as ``.grad`` does). With
  ``set_requires_gradient_sync(False)`` nothing is communicated: the full
  gradients accumulate until a synchronising backward reduces the sum.
- ``MixedPrecisionPolicy``: see ``_fsdp_api``. ``CPUOffloadPolicy``, an
  integer ``reshard_after_forward`` and meshes of more than one dimension
  (HSDP) raise NotImplementedError.
"""
import functools
import weakref

from ... import autograd
from ..._tensor import Tensor
from ...nn.parameter import Parameter
from .. import c10d, runtime
from ..device_mesh import DeviceMesh, init_device_mesh
from ..tensor._api import DTensor, gather_dim, local_piece, reduce_scatter_dim
from ..tensor._placements import Shard
from ._fsdp_api import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

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
        """Register the shards again in place of the full parameters."""
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


class _Entry:
    """One sharded parameter: where it is registered (every (module, name)
    of a tied parameter), its shard, and the full leaf used by forward and
    backward while the unit is unsharded."""

    def __init__(self, slots, shard):
        self.slots, self.shard, self.full = slots, shard, None

    def register(self, tensor):
        for owner, name in self.slots:
            owner._parameters[name] = tensor


class _State:
    def __init__(self, module, mesh, reshard_after_forward, mp_policy, entries):
        self.module, self.mesh, self.entries = module, mesh, entries
        self.comm = mesh.get_group(0).comm
        self.reshard_after_forward, self.mp = reshard_after_forward, mp_policy
        self.sync, self.pending, self.root = True, False, False

    def unshard(self):
        for e in self.entries:
            dim = e.shard.placements[0].dim
            arr = gather_dim(e.shard.array, dim, e.shard.global_shape[dim], self.comm)
            if self.mp.param_dtype is not None:
                arr = arr.astype(self.mp.param_dtype)
            if e.full is None:
                e.full = Parameter(arr, requires_grad=e.shard.requires_grad)
                if e.full.requires_grad:
                    e.full.register_post_accumulate_grad_hook(self._grad_ready)
            else:
                e.full.array = arr  # keeps the gradient accumulated without sync
            e.register(e.full)

    def reshard(self):
        for e in self.entries:
            e.register(e.shard)

    def _grad_ready(self, _full):
        if not self.pending:
            self.pending = True
            autograd.queue_callback(self._post_backward)

    def _post_backward(self):
        self.pending = False
        self.reshard()
        if not self.sync:
            return
        for e in self.entries:
            if e.full is not None and e.full.grad is not None:
                grad = e.full.grad.array
                reduce_dtype = self.mp.reduce_dtype or self.mp.param_dtype
                if reduce_dtype is not None:
                    grad = grad.astype(reduce_dtype)
                piece = reduce_scatter_dim(grad, e.shard.placements[0].dim, self.comm)
                piece = piece.astype(e.shard.array.dtype, copy=False)
                if e.shard.grad is None:
                    e.shard.grad = Tensor(piece)
                else:
                    e.shard.grad.array += piece
            e.full = None  # the gathered storage goes with the graph


def _forget(ref, key):
    if _sharded.get(key) is ref:
        del _sharded[key]


def _cast(value, dtype):
    """Floating tensors in ``value`` (nested tuples/lists/dicts) cast to ``dtype``."""
    if isinstance(value, Tensor):
        kind = value.array.dtype
        floating = kind.kind == "f" or kind.name == "bfloat16"
        return value.to(dtype) if floating and kind != dtype else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def _pre_forward(module, args, kwargs):
    state = module._fsdp_state
    state.root = _active["depth"] == 0
    _active["depth"] += 1
    state.unshard()
    if state.mp.param_dtype is not None and state.mp.cast_forward_inputs:
        return _cast(args, state.mp.param_dtype), _cast(kwargs, state.mp.param_dtype)
    return None


def _post_forward(module, args, output):
    state = module._fsdp_state
    _active["depth"] -= 1
    reshard = state.reshard_after_forward
    # without a graph no backward comes to reshard the units kept unsharded
    if reshard or (reshard is None and not state.root) or not autograd.is_grad_enabled():
        state.reshard()
    if state.mp.output_dtype is not None:
        return _cast(output, state.mp.output_dtype)
    return None


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


def _check(mesh, reshard_after_forward, mp_policy, offload_policy):
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"fully_shard(mesh=...) expects a DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim != 1:
        raise NotImplementedError(f"fully_shard on a {mesh.ndim}-D mesh (HSDP) is not "
                                  "supported by spmdnet: use a 1-D mesh")
    if reshard_after_forward is not None and not isinstance(reshard_after_forward, bool):
        raise NotImplementedError(f"fully_shard(reshard_after_forward={reshard_after_forward!r})"
                                  ": spmdnet takes True, False or None")
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"mp_policy must be a MixedPrecisionPolicy, got {mp_policy!r}")
    if isinstance(offload_policy, CPUOffloadPolicy):
        raise NotImplementedError("fully_shard(offload_policy=CPUOffloadPolicy()) is not "
                                  "supported by spmdnet")
    if not isinstance(offload_policy, OffloadPolicy):
        raise TypeError(f"offload_policy must be an OffloadPolicy, got {offload_policy!r}")


def _shard(param, mesh, placement):
    if param.array.ndim == 0:
        raise ValueError("fully_shard: a 0-dimensional parameter cannot be sharded")
    placement = Shard(0) if placement is None else placement
    if not isinstance(placement, Shard):
        raise NotImplementedError(f"shard_placement_fn returned {placement!r}: spmdnet "
                                  "shards with Shard(dim)")
    local, dim = local_piece(param.array, mesh, Shard(placement.dim))
    return DTensor(local, mesh, (Shard(dim),), param.array.shape, param.requires_grad)


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
    _check(mesh, reshard_after_forward, mp_policy, offload_policy)
    if isinstance(module, FSDPModule):
        raise ValueError(f"fully_shard was already applied to {type(module).__name__}")
    entries = []
    for param, slots in _managed(module, ignored_params or ()).values():
        placement = shard_placement_fn(param) if shard_placement_fn is not None else None
        entry = _Entry(slots, _shard(param, mesh, placement))
        entry.register(entry.shard)
        entries.append(entry)
        _sharded[id(param)] = weakref.ref(param, functools.partial(_forget, key=id(param)))
    state = _State(module, mesh, reshard_after_forward, mp_policy, entries)
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
