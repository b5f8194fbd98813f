"""Module: ordered registration of parameters, buffers and submodules by
attribute, with PyTorch's dotted names and state_dict keys."""
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from ... import host_memory
from ...autograd.grad_placement import has_placement
from ...backend import to_device
from ..._args import resolve_device, resolve_dtype
from ..._device import builds_on_meta, meta_array
from ..._tensor import Tensor
from ..parameter import Parameter, grad_array
from . import _hooks, _memory, _state
from ._hooks import (ModuleHooks, register_module_forward_hook, register_module_forward_pre_hook,
                     register_module_full_backward_hook, register_module_full_backward_pre_hook)
from ._hooks import GLOBAL_ACTIVE as _GLOBAL_ACTIVE
from ._state import _IncompatibleKeys, _entry_error, _load_entry

__all__ = ["Module", "register_module_forward_pre_hook", "register_module_forward_hook",
           "register_module_full_backward_pre_hook", "register_module_full_backward_hook"]


class Module(ModuleHooks):
    """Base class: set Parameters and Modules as attributes; define forward.
    Hooks: ``register_forward_hook`` and its kin (``_hooks.py``)."""

    _version = 1  # state_dict's local_metadata["version"], as PyTorch's

    def __init__(self):
        host_memory.retain_freed_memory()  # once per process; a module may hold no tensor
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_non_persistent_buffers_set", set())
        _hooks.init_hook_tables(self)

    def __setstate__(self, state):
        self.__dict__.update(state)
        _hooks.init_hook_tables(self)  # a module pickled without hook tables

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}: call super().__init__() before "
                               f"assigning {name!r}")
        # As PyTorch: re-assigning a registered name keeps its place in the
        # order (state_dict keys, parameter order); a parameter or module slot
        # takes only its own kind or None, so a stray Tensor cannot silently
        # unregister a parameter; a buffer slot takes a Tensor, array or None.
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, Parameter):
            target = params
        elif isinstance(value, Module):
            target = modules
        elif name in params or name in modules:
            if value is not None:
                kind = "parameter" if name in params else "module"
                raise TypeError(f"cannot assign {type(value).__name__} as {kind} {name!r} of "
                                f"{type(self).__name__} (a {kind} or None expected)")
            target = params if name in params else None  # no None entries in _modules
        elif name in buffers:
            target = buffers
            if value is not None and not isinstance(value, Tensor):
                value = Tensor(value)
        else:
            target = None
        for table in (params, buffers, modules):
            if table is not target:
                table.pop(name, None)
        if target is not buffers:
            self._non_persistent_buffers_set.discard(name)
        if target is None:
            object.__setattr__(self, name, value)
            return
        target[name] = value
        self.__dict__.pop(name, None)

    def __getattr__(self, name):  # only called when normal lookup fails
        for table in ("_parameters", "_buffers", "_modules"):
            entries = self.__dict__.get(table)
            if entries is not None and name in entries:
                return entries[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name):
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    # -- registration ------------------------------------------------------------------
    def _check_new_name(self, name, table, kind):
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string, got {type(name).__name__}")
        if "." in name or name == "":
            raise KeyError(f"{kind} name can't contain \".\" or be empty, got {name!r}")
        if hasattr(self, name) and name not in getattr(self, table):
            raise KeyError(f"attribute '{name}' already exists")

    def register_buffer(self, name, tensor, persistent=True):
        """Non-trainable state (a Tensor, an array, or None): listed by
        ``buffers()``, moved by ``to()``, saved in ``state_dict`` unless
        ``persistent=False``."""
        self._check_new_name(name, "_buffers", "buffer")
        if tensor is not None and not isinstance(tensor, Tensor):
            tensor = Tensor(tensor)
            if builds_on_meta():  # a layer's new array: shape-only under device("meta")
                tensor = Tensor(meta_array(tensor.shape, tensor.dtype))
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_parameter(self, name, param):
        """Register a Parameter (or None) under ``name``."""
        self._check_new_name(name, "_parameters", "parameter")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign {type(param).__name__} object to parameter "
                            f"{name!r} (nn.Parameter or None required)")
        self._parameters[name] = param

    def add_module(self, name, module):
        """Register a submodule (or None) under ``name``."""
        self._check_new_name(name, "_modules", "module")
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._modules[name] = module

    register_module = add_module

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        if (_GLOBAL_ACTIVE[0] or self._forward_hooks or self._forward_pre_hooks
                or self._backward_hooks or self._backward_pre_hooks):
            return _hooks.call_with_hooks(self, args, kwargs)
        return self.forward(*args, **kwargs)

    # -- traversal ---------------------------------------------------------------
    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """(dotted name, module) for self and every submodule, depth first."""
        memo = set() if memo is None else memo
        if remove_duplicate:
            if self in memo:
                return
            memo.add(self)
        yield prefix, self
        for name, mod in self._modules.items():
            if mod is not None:
                yield from mod.named_modules(memo, f"{prefix}.{name}" if prefix else name,
                                             remove_duplicate)

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_children(self):
        """(name, module) of the direct submodules, each module once."""
        seen = set()
        for name, mod in self._modules.items():
            if mod is not None and mod not in seen:
                seen.add(mod)
                yield name, mod

    def children(self):
        return (m for _, m in self.named_children())

    def _named(self, table, prefix="", recurse=True, remove_duplicate=True):
        seen = set()
        mods = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for mod_name, mod in mods:
            for name, value in getattr(mod, table).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))  # a shared parameter is listed once
                yield (f"{mod_name}.{name}" if mod_name else name), value

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        return (b for _, b in self.named_buffers(recurse=recurse))

    def apply(self, fn):
        """``fn(m)`` for every submodule, children before parents (as PyTorch), then self."""
        for mod in self.children():
            mod.apply(fn)
        fn(self)
        return self

    # -- modes and gradients -------------------------------------------------------
    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        object.__setattr__(self, "training", mode)
        for mod in self.children():
            mod.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        """Set ``requires_grad`` on every parameter; returns self."""
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def zero_grad(self, set_to_none=True):
        """Drop every parameter's gradient (PyTorch's default since 2.0), or
        zero it in place with ``set_to_none=False``. Under DataParallel both
        keep the bucket: a None gradient is written into its placement
        (the bucket view) by the next backward."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def to(self, *args, **kwargs):
        """``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(tensor)`` or
        keywords ``device=``/``dtype=``: move every parameter and buffer to
        "cpu" or "gpu" ("cuda", "cuda:N": this rank's GPU) and cast the
        floating ones to ``dtype``, in place; returns self. Do it before
        wrapping in DataParallel."""
        device, dtype = _to_args(args, kwargs)
        for t in self._tensors():
            if dtype is not None and t.array.dtype.kind == "f" and t.array.dtype != dtype:
                if has_placement(t):
                    raise RuntimeError("Module.to(dtype): a parameter's gradient lives in a "
                                       "DataParallel bucket; cast the model before wrapping")
                t.data = t.array.astype(dtype)  # .data: refused where a wrapper owns it
                g = grad_array(t)
                t.grad = None if g is None else g.astype(dtype)
            moved = t.array if device is None else to_device(t.array, device)
            if moved is not t.array:
                t.data = moved
                g = grad_array(t)
                t.grad = None if g is None else to_device(g, device)
        return self

    def float(self):
        return self.to(dtype=np.float32)

    def double(self):
        return self.to(dtype=np.float64)

    def half(self):
        return self.to(dtype=np.float16)

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None):
        """Move to this rank's GPU (``device`` is accepted for PyTorch's signature)."""
        return self.to("gpu")

    def to_empty(self, *, device=None, recurse=True):
        """Every parameter and buffer gets uninitialised storage of its shape
        on ``device``; fill it with ``reset_parameters()`` or a state_dict."""
        return _memory.to_empty(self, device, recurse)

    def share_memory(self):
        """Host parameters and buffers into shared memory (see ``_memory.py``)."""
        return _memory.share_memory(self)

    def _tensors(self):
        """Every parameter and buffer once (for ``to``)."""
        return list(self.parameters()) + list(self.buffers())

    # -- state -------------------------------------------------------------------
    def _state_slots(self):
        """(key, module, local name, tensor) in PyTorch's state_dict order: a
        module's own parameters, then its persistent buffers, then each
        child's, depth first. Unlike named_parameters(), a shared tensor
        appears under every name, as in PyTorch (tied weights give two keys)."""
        out, stack = [], [("", self)]
        while stack:
            prefix, mod = stack.pop()
            out.extend((prefix + k, mod, k, t) for k, t in mod._parameters.items()
                       if t is not None)
            out.extend((prefix + k, mod, k, t) for k, t in mod._buffers.items()
                       if t is not None and k not in mod._non_persistent_buffers_set)
            stack.extend(reversed([(f"{prefix}{k}.", m) for k, m in mod._modules.items()
                                   if m is not None]))
        return out

    def _state_items(self):
        """(key, tensor) in state_dict order (see ``_state_slots``)."""
        return [(key, t) for key, _, _, t in self._state_slots()]

    def state_dict(self, *, destination=None, prefix="", keep_vars=False):
        """PyTorch's: an OrderedDict {dotted name: detached Tensor sharing
        memory with the parameter or buffer}, so ``sd[k].copy_(v)`` writes
        the model (copy what must not change: ``v.clone()``, ``v.numpy()``).
        ``keep_vars=True`` gives the Parameters themselves."""
        out = OrderedDict() if destination is None else destination
        if _state.has_state_dict_hooks(self):
            return _state.state_dict_with_hooks(self, out, prefix, keep_vars)
        for key, t in self._state_items():
            out[prefix + key] = t if keep_vars else t.detach()
        return out

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Copy Tensors (or NumPy/CuPy arrays) into the parameters and buffers,
        in place and cast to their dtype and device (views onto them, such
        as data parallelism's buckets, stay valid); ``assign=True`` makes the
        given tensors the parameters and buffers instead (as PyTorch: the
        Parameter keeps its requires_grad). Every problem is collected first
        and raised as one RuntimeError with PyTorch's text (missing and
        unexpected keys only with ``strict``, shape mismatches always);
        nothing is loaded then. Returns ``_IncompatibleKeys(missing_keys,
        unexpected_keys)``."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        if _state.has_load_hooks(self):  # PyTorch's module-by-module load, hooks between
            missing, unexpected, errors = _state.load_with_hooks(
                self, state_dict, assign, _entry_error, _load_entry)
            return self._load_result(missing, unexpected, errors, strict)
        slots = self._state_slots()
        own = {key for key, _, _, _ in slots}
        missing = [key for key, _, _, _ in slots if key not in state_dict]
        unexpected = [key for key in state_dict if key not in own]
        errors = [e for key, _, _, t in slots if key in state_dict
                  and (e := _entry_error(key, t, state_dict[key], assign))]
        self._load_result(missing, unexpected, errors, strict)
        for key, mod, name, t in slots:
            if key in state_dict:
                _load_entry(mod, name, t, state_dict[key], assign)
        return _IncompatibleKeys(missing, unexpected)

    def _load_result(self, missing, unexpected, errors, strict):
        """Raise PyTorch's RuntimeError for ``errors`` (and, with ``strict``,
        missing and unexpected keys); else the keys as ``_IncompatibleKeys``."""
        errors = list(errors)
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: "
                              + ", ".join(f'"{k}"' for k in unexpected) + ". ")
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: "
                              + ", ".join(f'"{k}"' for k in missing) + ". ")
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t"
                               + "\n\t".join(errors))
        return _IncompatibleKeys(missing, unexpected)

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"({k}): " + repr(m).replace("\n", "\n  ") for k, m in self._modules.items()]
        body = "\n  " + "\n  ".join(lines) + "\n" if lines else ""
        return f"{type(self).__name__}({self.extra_repr()}{body})"


def _to_args(args, kwargs):
    """(device, dtype) from ``Module.to``'s arguments, PyTorch's forms."""
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    kwargs.pop("non_blocking", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    for arg in args:
        if isinstance(arg, Tensor):
            device, dtype = arg.device, arg.dtype
        elif isinstance(arg, str):
            device = arg
        elif arg is not None:
            dtype = arg
    # no default device here: Module.to(dtype) inside `with sn.device(...)` keeps the device
    device, dtype = resolve_device(device, use_default=False), resolve_dtype(dtype)
    if dtype is not None and dtype.kind not in "fc":
        raise TypeError(f"nn.Module.to only accepts floating point dtypes, "
                        f"but got desired dtype={dtype}")
    return device, dtype
