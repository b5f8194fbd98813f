"""How FullyShardedDataParallel reaches into the wrapped model: through
``nn.Module``'s hooks only, so nothing is assigned onto the user's modules
and the hooks a user registers fire as they would without FSDP.

A wrapped unit (``unit_hooks``): a forward pre-hook gathers its parameters,
saves the RNG state and turns the graph off; the forward runs (the module's
own ``forward``, with every hook the user registered; its full backward hooks
are left to the recomputation, which runs them with the true gradients, see
``_units.UnitRun``); a forward hook, first
among the module's and called even when forward raises, frees the
parameters (the output copied first when it is a view of them), restores the
grad mode and, in a training forward, returns the output as the result of
one ``_units.UnitRun`` over the unit's shards and inputs, whose backward
recomputes the unit. Under ``no_grad`` the unit simply runs gathered.

The wrapped model's state (``state_hooks``): ``model.state_dict()`` gathers
the units whose parameters are freed, saves copies, frees them again;
``model.load_state_dict(state)`` gathers every unit, loads into the full
parameters and keeps this rank's shards.
"""
from ..._tensor import Tensor
from ... import random as sn_random
from ...autograd import is_grad_enabled, no_grad
from ...nn.modules._hooks import defer_backward_hooks
from ._init_utils import cast_inputs
from ._units import UnitRun


def unit_hooks(owner, unit):
    """Install the hooks that run ``unit`` (a recomputed unit) under
    ``owner`` (the FullyShardedDataParallel); returns their handles."""
    calls = []  # per call in progress: (grad mode was on, the no_grad context, RNG state)
    mp = owner.precision
    cast = mp.param_dtype if mp.cast_forward_inputs else None

    def before(module, args):
        grad = is_grad_enabled()
        mode = no_grad() if grad else None
        calls.append((grad, mode, sn_random.get_rng_state() if grad else None))
        unit.gather()
        if cast is not None:  # mixed precision's cast_forward_inputs, in the graph
            args = cast_inputs(cast, args, {})[0]
        if mode is not None:
            defer_backward_hooks(module)  # the recomputation in backward has the graph
            mode.__enter__()
        return args if cast is not None else None

    def after(module, args, kwargs, out):
        if not calls:
            return None  # an earlier pre-hook raised: this call never gathered
        grad, mode, rng = calls.pop()
        try:
            data = unit.own(out.array) if isinstance(out, Tensor) else None
        finally:
            unit.free()
            if mode is not None:
                mode.__exit__(None, None, None)
        if not grad:
            return None if data is None or data is out.array else Tensor(data)
        owner.poke()
        if out is None:  # forward raised (this hook is always called)
            return None
        if data is None:
            raise TypeError(f"FSDP unit {unit.name!r} must return one Tensor, "
                            f"got {type(out).__name__}")
        bad = [type(a).__name__ for a in args if not isinstance(a, Tensor)]
        if bad:
            raise TypeError(f"FSDP unit {unit.name!r}: positional arguments must be "
                            f"Tensors, got {bad} (pass other values as keywords)")
        return owner.record_unit(unit, args, kwargs, data, rng)

    module = unit.module
    return [module.register_forward_pre_hook(before),
            module.register_forward_hook(after, prepend=True, with_kwargs=True,
                                         always_call=True)]


def run_unit(owner, unit, args, kwargs, data, rng, links):
    """The training forward's output of ``unit``: ``data`` as the result of
    one ``UnitRun`` (backward by recomputation from ``args``)."""
    shards = [f.shard for f in unit.flats]
    return UnitRun.apply(*shards, *args, *links, unit=unit, n_shards=len(shards),
                         n_links=len(links), kwargs=kwargs, owner=owner, result=data, rng=rng)


def state_hooks(owner, model):
    """Install the state-dict hooks on the wrapped ``model``; returns their handles."""
    gathered, loading = [], []  # flats gathered for a save, (flat, full) for a load

    def save_pre(module, prefix, keep_vars):
        gathered[:] = [f for f in owner.flats() if not f.live]  # a pending backward keeps
        for f in gathered:                                        # the others gathered
            f.gather(exact=True)

    def save_post(module, state, prefix, local_metadata):
        try:  # copies, as PyTorch's full state: the gathered arrays are freed below
            cast = owner.buffer_dtypes  # buffers cast by mixed precision: saved as they were
            for key in [k for k in state if k.startswith(prefix)]:
                dtype = cast.get(key[len(prefix):])
                array = state[key].array
                state[key] = Tensor(array.copy() if dtype is None else array.astype(dtype))
        finally:
            for f in gathered:
                f.free()
            gathered.clear()

    def load_pre(module, state, prefix, *rest):
        owner.check_loadable()
        loading[:] = [(f, f.gather(exact=True)) for f in owner.flats()]

    def load_post(module, incompatible_keys):
        try:
            for f, full in loading:
                f.load_full(full)
        finally:
            for f, _ in loading:
                f.free()
            loading.clear()

    return [model.register_state_dict_pre_hook(save_pre),
            model.register_state_dict_post_hook(save_post),
            model.register_load_state_dict_pre_hook(load_pre),
            model.register_load_state_dict_post_hook(load_post)]
