"""``torch.distributed.fsdp.wrap``'s auto-wrap policies, and the walk that
turns one into the set of modules to wrap.

A policy is called as ``policy(module=m, recurse=..., nonwrapped_numel=n)``:
with ``recurse=True`` it says whether to look into ``m``'s children, with
``recurse=False`` whether to wrap ``m``, ``n`` being the number of ``m``'s
parameters not already inside a wrapped descendant. ``wrapped_modules``
walks the model bottom-up in that order (PyTorch's documented recursion),
so ``size_based_auto_wrap_policy`` sees the same numbers as PyTorch's.

spmdnet's own form, ``FullyShardedDataParallel(..., wrap=...)``: module
classes or a predicate on modules (``policy``); ``owners`` then walks the
model: a module the policy wraps starts a unit, the rest belongs to the
enclosing unit (the root "").
"""
import functools

from ... import nn


class ModuleWrapPolicy:
    """Wrap every module that is an instance of one of ``module_classes``."""

    def __init__(self, module_classes):
        self._module_classes = set(module_classes)

    def __call__(self, module, recurse, *args, **kwargs):
        return True if recurse else isinstance(module, tuple(self._module_classes))

    def __repr__(self):
        return f"ModuleWrapPolicy({sorted(c.__name__ for c in self._module_classes)})"


class CustomPolicy:
    """Wrap the modules for which ``lambda_fn(module)`` is truthy."""

    def __init__(self, lambda_fn):
        self._lambda_fn = lambda_fn

    def __call__(self, module, recurse, *args, **kwargs):
        return True if recurse else bool(self._lambda_fn(module))


def always_wrap_policy(*args, **kwargs):
    return True


def lambda_auto_wrap_policy(module, recurse, nonwrapped_numel, lambda_fn):
    return True if recurse else bool(lambda_fn(module))


def transformer_auto_wrap_policy(module, recurse, nonwrapped_numel, transformer_layer_cls):
    return True if recurse else isinstance(module, tuple(transformer_layer_cls))


def size_based_auto_wrap_policy(module, recurse, nonwrapped_numel, min_num_params=int(1e8),
                                force_leaf_modules=None, exclude_wrap_modules=None):
    """Wrap a module once ``min_num_params`` of its parameters are not yet
    wrapped; never look into ``force_leaf_modules`` (default
    MultiheadAttention) nor wrap ``exclude_wrap_modules`` (default
    ModuleList, ModuleDict), PyTorch's defaults."""
    leaves = size_based_auto_wrap_policy.FORCE_LEAF_MODULES if force_leaf_modules is None \
        else force_leaf_modules
    excluded = size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES \
        if exclude_wrap_modules is None else exclude_wrap_modules
    if recurse:
        return not isinstance(module, tuple(leaves))
    return nonwrapped_numel >= min_num_params and not isinstance(module, tuple(excluded))


size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {nn.MultiheadAttention}
size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {nn.ModuleList, nn.ModuleDict}


def _numel(module):
    return sum(int(p.numel()) for p in module.parameters())


def wrapped_modules(root, policy):
    """The ids of the modules under ``root`` that ``policy`` wraps (the root is
    wrapped by FullyShardedDataParallel itself)."""
    chosen = set()

    def visit(module):
        """How many of ``module``'s parameters end up inside wrapped modules."""
        total = _numel(module)
        if not policy(module=module, recurse=True, nonwrapped_numel=total):
            return 0
        wrapped = sum(visit(child) for child in module.children())
        if module is not root and policy(module=module, recurse=False,
                                         nonwrapped_numel=total - wrapped):
            chosen.add(id(module))
            return total
        return wrapped

    visit(root)
    return chosen


def as_wrap(root, auto_wrap_policy):
    """spmdnet's ``wrap=`` (a module -> bool function) for PyTorch's policy."""
    if auto_wrap_policy is None:
        return None
    if not callable(auto_wrap_policy):
        raise TypeError(f"auto_wrap_policy must be a policy or a callable, got "
                        f"{auto_wrap_policy!r}")
    chosen = wrapped_modules(root, auto_wrap_policy)
    return functools.partial(_is_chosen, chosen)


def _is_chosen(chosen, module):
    return id(module) in chosen


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


__all__ = ["ModuleWrapPolicy", "CustomPolicy", "always_wrap_policy",
           "lambda_auto_wrap_policy", "transformer_auto_wrap_policy",
           "size_based_auto_wrap_policy", "wrapped_modules"]
