"""``nn.Module``'s hooks, PyTorch's rules: the registration methods (a base
class of ``Module``), the global module hooks and the call path a module
takes when any hook is registered (the state-dict hooks run in ``_state.py``).

Call order, as PyTorch's: forward pre-hooks (global ones first, then the
module's; ``prepend=True`` puts a hook first among the module's), forward,
forward hooks (global, then the module's); a pre-hook's non-None result
replaces the positional arguments (a non-tuple is wrapped), a forward hook's
replaces the output. Full backward pre-hooks see ``grad_output`` and
backward hooks ``grad_input`` (``spmdnet.utils.hooks.BackwardHook``).
``always_call=True`` forward hooks also run when forward raises.
"""
import warnings
import weakref
from collections import OrderedDict

from ..._tensor import Tensor
from ._backward import BackwardHook


class RemovableHandle:
    """What every ``register_*hook`` returns: ``handle.remove()`` (or leaving
    a ``with`` block) unregisters the hook. ``handle.id`` is the hook's key in
    its table and in the ``extra_dict`` tables (such as the with_kwargs one)."""

    __module__ = "spmdnet.utils.hooks"  # PyTorch's torch.utils.hooks: the public path
    next_id = 0

    def __init__(self, hooks_dict, *, extra_dict=None, _on_remove=None):
        self.hooks_dict_ref, self._on_remove = weakref.ref(hooks_dict), _on_remove
        self.id = RemovableHandle.next_id
        RemovableHandle.next_id += 1
        extras = extra_dict if isinstance(extra_dict, (list, tuple)) else \
            ([] if extra_dict is None else [extra_dict])
        self.extra_dict_ref = tuple(weakref.ref(d) for d in extras)

    def remove(self):
        for ref in (self.hooks_dict_ref, *self.extra_dict_ref):
            table = ref()
            if table is not None:
                table.pop(self.id, None)
        if self._on_remove is not None:
            self._on_remove()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


_global_forward_pre_hooks = OrderedDict()
_global_forward_hooks = OrderedDict()
_global_forward_hooks_with_kwargs = OrderedDict()
_global_forward_hooks_always_called = OrderedDict()
_global_backward_pre_hooks = OrderedDict()
_global_backward_hooks = OrderedDict()

_TABLES = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
           "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
           "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
           "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def init_hook_tables(module):
    """Give ``module`` its (empty) hook tables, PyTorch's attribute names."""
    for name in _TABLES:
        if name not in module.__dict__:
            object.__setattr__(module, name, OrderedDict())


# GLOBAL_ACTIVE[0]: whether any global module hook is registered, kept by the
# register_module_* functions and their handles, so that a module call with no
# hook tests one flag for all four tables
GLOBAL_ACTIVE = [False]


def _global_changed():
    GLOBAL_ACTIVE[0] = bool(_global_forward_pre_hooks or _global_forward_hooks
                            or _global_backward_pre_hooks or _global_backward_hooks)


def global_hooks_registered():
    """True while any global module hook is registered."""
    return GLOBAL_ACTIVE[0]


def _add_global(table, hook, extra=()):
    handle = RemovableHandle(table, extra_dict=list(extra), _on_remove=_global_changed)
    table[handle.id] = hook
    _global_changed()
    return handle


def register_module_forward_pre_hook(hook):
    """A forward pre-hook ``hook(module, args)`` for every module, run before
    the module's own pre-hooks."""
    return _add_global(_global_forward_pre_hooks, hook)


def register_module_forward_hook(hook, *, with_kwargs=False, always_call=False):
    """A forward hook ``hook(module, args, output)`` (``with_kwargs``:
    ``hook(module, args, kwargs, output)``) for every module, run before the
    module's own forward hooks."""
    handle = _add_global(_global_forward_hooks, hook, [_global_forward_hooks_with_kwargs,
                                                       _global_forward_hooks_always_called])
    if with_kwargs:
        _global_forward_hooks_with_kwargs[handle.id] = True
    if always_call:
        _global_forward_hooks_always_called[handle.id] = True
    return handle


def register_module_full_backward_pre_hook(hook):
    """A backward pre-hook ``hook(module, grad_output)`` for every module."""
    return _add_global(_global_backward_pre_hooks, hook)


def register_module_full_backward_hook(hook):
    """A backward hook ``hook(module, grad_input, grad_output)`` for every module."""
    return _add_global(_global_backward_hooks, hook)


def _add(table, hook, prepend, extra=()):
    handle = RemovableHandle(table, extra_dict=list(extra))
    table[handle.id] = hook
    if prepend:
        table.move_to_end(handle.id, last=False)
    return handle


class ModuleHooks:
    """The ``register_*hook`` methods of ``nn.Module``."""

    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        """``hook(module, args)`` (``with_kwargs``: ``hook(module, args, kwargs)``,
        returning None or ``(args, kwargs)``) before each forward."""
        handle = _add(self._forward_pre_hooks, hook, prepend,
                      [self._forward_pre_hooks_with_kwargs])
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        return handle

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False,
                              always_call=False):
        """``hook(module, args, output)`` (``with_kwargs``: ``hook(module, args,
        kwargs, output)``) after each forward; ``always_call``: also when it raises."""
        handle = _add(self._forward_hooks, hook, prepend,
                      [self._forward_hooks_with_kwargs, self._forward_hooks_always_called])
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        return handle

    def register_full_backward_pre_hook(self, hook, prepend=False):
        """``hook(module, grad_output)`` when the output's gradient is known;
        a non-None result replaces ``grad_output``."""
        return _add(self._backward_pre_hooks, hook, prepend)

    def register_full_backward_hook(self, hook, prepend=False):
        """``hook(module, grad_input, grad_output)`` when the inputs' gradient
        is known; a non-None result replaces ``grad_input``."""
        return _add(self._backward_hooks, hook, prepend)

    def register_state_dict_pre_hook(self, hook):
        """``hook(module, prefix, keep_vars)`` before ``state_dict`` saves this module."""
        return _add(self._state_dict_pre_hooks, hook, False)

    def register_state_dict_post_hook(self, hook):
        """``hook(module, state_dict, prefix, local_metadata)`` after this
        module and its children are saved; it edits ``state_dict`` in place."""
        hook._spmdnet_returns_none = True
        return _add(self._state_dict_hooks, hook, False)

    def _register_state_dict_hook(self, hook):
        """As ``register_state_dict_post_hook``, but a non-None result replaces
        the state_dict (PyTorch's older form)."""
        return _add(self._state_dict_hooks, hook, False)

    def register_load_state_dict_pre_hook(self, hook):
        """``hook(module, state_dict, prefix, local_metadata, strict,
        missing_keys, unexpected_keys, error_msgs)`` before this module loads."""
        return _add(self._load_state_dict_pre_hooks, hook, False)

    def _register_load_state_dict_pre_hook(self, hook, with_module=False):
        if with_module:
            return self.register_load_state_dict_pre_hook(hook)
        return _add(self._load_state_dict_pre_hooks,
                    lambda module, *args: hook(*args), False)

    def register_load_state_dict_post_hook(self, hook):
        """``hook(module, incompatible_keys)`` after this module and its
        children loaded; it may edit ``missing_keys``/``unexpected_keys`` in place."""
        return _add(self._load_state_dict_post_hooks, hook, False)


# ids of modules whose call in progress leaves its full backward hooks to the
# module's owner (``defer_backward_hooks``)
_DEFERRED_BACKWARD = set()


def defer_backward_hooks(module):
    """Called from a forward pre-hook of ``module``: this call sets up no
    ``BackwardHook``; the caller gives the hooks their gradients itself
    (FullyShardedDataParallel runs a unit without a graph and recomputes it
    in backward, where the gates go)."""
    _DEFERRED_BACKWARD.add(id(module))


def backward_hooks_of(module):
    """(full backward hooks, backward pre-hooks) of a call of ``module``:
    the global ones first, then the module's."""
    return ([*_global_backward_hooks.values(), *module._backward_hooks.values()],
            [*_global_backward_pre_hooks.values(), *module._backward_pre_hooks.values()])


def call_with_hooks(module, args, kwargs):
    """``module(*args, **kwargs)`` with its hooks and the global ones."""
    fired, result = set(), None
    try:
        for hook_id, hook in (*_global_forward_pre_hooks.items(),
                              *module._forward_pre_hooks.items()):
            if hook_id in module._forward_pre_hooks_with_kwargs:
                new = hook(module, args, kwargs)
                if new is not None:
                    if not (isinstance(new, tuple) and len(new) == 2):
                        raise RuntimeError("forward pre-hook must return None or a tuple of "
                                           f"(new_args, new_kwargs), but got {new}.")
                    args, kwargs = new
            else:
                new = hook(module, args)
                if new is not None:
                    args = new if isinstance(new, tuple) else (new,)
        backward_hooks, backward_pre_hooks = backward_hooks_of(module)
        deferred = id(module) in _DEFERRED_BACKWARD
        _DEFERRED_BACKWARD.discard(id(module))
        bw_hook = None
        if (backward_hooks or backward_pre_hooks) and not deferred:
            bw_hook = BackwardHook(module, backward_hooks, backward_pre_hooks)
            args = bw_hook.setup_input_hook(args)
        result = module.forward(*args, **kwargs)
        for hook_id, hook in (*_global_forward_hooks.items(), *module._forward_hooks.items()):
            if hook_id in module._forward_hooks_always_called or \
                    hook_id in _global_forward_hooks_always_called:
                fired.add(hook_id)
            if hook_id in module._forward_hooks_with_kwargs or \
                    hook_id in _global_forward_hooks_with_kwargs:
                new = hook(module, args, kwargs, result)
            else:
                new = hook(module, args, result)
            if new is not None:
                result = new
        if bw_hook is not None:
            if not isinstance(result, (Tensor, tuple)):
                warnings.warn("For backward hooks to be called, module output should be a "
                              f"Tensor or a tuple of Tensors but received {type(result)}",
                              stacklevel=3)
            result = bw_hook.setup_output_hook(result)
        return result
    except Exception:
        _DEFERRED_BACKWARD.discard(id(module))
        _always_called(module, args, kwargs, result, fired)
        raise


def _always_called(module, args, kwargs, result, fired):
    """The ``always_call`` forward hooks that forward's exception skipped; an
    exception of theirs becomes a warning (forward's own propagates)."""
    for table, always, kw in ((_global_forward_hooks, _global_forward_hooks_always_called,
                               _global_forward_hooks_with_kwargs),
                              (module._forward_hooks, module._forward_hooks_always_called,
                               module._forward_hooks_with_kwargs)):
        for hook_id, hook in list(table.items()):
            if hook_id not in always or hook_id in fired:
                continue
            try:
                new = hook(module, args, kwargs, result) if hook_id in kw else \
                    hook(module, args, result)
                result = result if new is None else new
            except Exception as e:  # noqa: BLE001 - forward's exception is the one raised
                warnings.warn("module forward hook with ``always_call=True`` raised an "
                              f"exception that was silenced as another error was raised in "
                              f"forward: {e}", stacklevel=4)
