"""``nn.Module``'s state-dict helpers: one entry checked and loaded, the
result tuple, and PyTorch's recursive traversals that run the state-dict
hooks (``Module.state_dict``/``load_state_dict`` take them only when some
module of the tree has such a hook; else one flat pass over
``Module._state_slots``)."""
from collections import OrderedDict, namedtuple

from ..._owned_storage import owner_of
from ..._tensor import Tensor
from ...autograd.grad_placement import has_placement
from ...backend import device_of, to_device
from ..parameter import Parameter


def _entry_error(key, t, value, assign):
    """Why ``value`` cannot be loaded into ``t`` (PyTorch's message), or None."""
    if not (isinstance(value, Tensor) or hasattr(value, "__array_interface__")
            or hasattr(value, "__cuda_array_interface__")):
        return (f'While copying the parameter named "{key}", expected Tensor or '
                f"array-like object from checkpoint but received {type(value)}")
    if tuple(value.shape) != t.shape:
        return (f"size mismatch for {key}: copying a param with shape "
                f"{tuple(value.shape)} from checkpoint, the shape in current "
                f"model is {t.shape}.")
    if assign and (owner_of(t) or has_placement(t)):
        return (f"cannot assign {key}: a wrapper (DataParallel, FSDP, ZeRO) "
                "holds views of it; load in place (assign=False)")
    return None


def _load_entry(mod, name, t, value, assign):
    """Put ``value`` (a Tensor or an array of ``t``'s shape) into slot
    ``name`` of ``mod``, whose tensor is ``t``: in place (cast to t's dtype,
    moved to t's device), or with ``assign`` as the new tensor itself."""
    array = value.array if isinstance(value, Tensor) else value
    if not assign:
        t.array[...] = to_device(array, device_of(t.array))
    elif isinstance(t, Parameter):
        mod._parameters[name] = Parameter(array, requires_grad=t.requires_grad)
    else:
        mod._buffers[name] = value if isinstance(value, Tensor) else Tensor(array)


def _metadata(module):
    return {"version": getattr(type(module), "_version", 1)}


def has_state_dict_hooks(root):
    return any(m._state_dict_hooks or m._state_dict_pre_hooks for m in root.modules())


def has_load_hooks(root):
    return any(m._load_state_dict_pre_hooks or m._load_state_dict_post_hooks
               for m in root.modules())


def own_slots(module):
    """(local name, tensor) of the module's own state_dict entries."""
    return [*((k, t) for k, t in module._parameters.items() if t is not None),
            *((k, t) for k, t in module._buffers.items()
              if t is not None and k not in module._non_persistent_buffers_set)]


def state_dict_with_hooks(module, destination, prefix, keep_vars):
    """PyTorch's recursive ``state_dict``: this module's pre-hooks, its own
    entries, its children's, then its post-hooks (which may replace the dict)."""
    for hook in module._state_dict_pre_hooks.values():
        hook(module, prefix, keep_vars)
    for name, t in own_slots(module):
        destination[prefix + name] = t if keep_vars else t.detach()
    for name, child in module._modules.items():
        if child is not None:
            destination = state_dict_with_hooks(child, destination, f"{prefix}{name}.",
                                                keep_vars)
    for hook in module._state_dict_hooks.values():
        result = hook(module, destination, prefix, _metadata(module))
        if result is not None:
            if getattr(hook, "_spmdnet_returns_none", False):
                raise RuntimeError("state_dict post-hook must return None")
            destination = result
    return destination


def load_with_hooks(root, state_dict, assign, entry_error, load_entry):
    """PyTorch's recursive ``load_state_dict`` when load hooks are registered:
    per module, its pre-hooks (which may edit the dict), its own entries
    checked (``entry_error``) and loaded (``load_entry``), its children,
    then its post-hooks. Returns (missing, unexpected, error messages)."""
    missing, unexpected, errors = [], [], []

    def load(module, local, prefix):
        for hook in module._load_state_dict_pre_hooks.values():
            hook(module, local, prefix, _metadata(module), True, missing, unexpected, errors)
        own = own_slots(module)
        for name, t in own:
            key = prefix + name
            if key not in local:
                missing.append(key)
                continue
            error = entry_error(key, t, local[key], assign)
            if error:
                errors.append(error)
            else:
                load_entry(module, name, t, local[key], assign)
        names = {name for name, _ in own}
        for key in local:
            if key.startswith(prefix):
                first = key[len(prefix):].split(".", 1)[0]
                if first not in module._modules and first not in names:
                    unexpected.append(key)
        for name, child in module._modules.items():
            if child is not None:
                child_prefix = f"{prefix}{name}."
                load(child, {k: v for k, v in local.items() if k.startswith(child_prefix)},
                     child_prefix)
        keys = _IncompatibleKeys(missing, unexpected)
        for hook in module._load_state_dict_post_hooks.values():
            if hook(module, keys) is not None:
                raise RuntimeError("load_state_dict post-hook must return None")

    load(root, OrderedDict(state_dict), "")
    return missing, unexpected, errors


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    """``load_state_dict``'s result, PyTorch's named tuple (equal to the
    plain tuple ``(missing, unexpected)``); load post-hooks get one holding
    the lists being built, to edit in place."""

    __slots__ = ()

    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__
