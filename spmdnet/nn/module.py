"""Module: ordered registration of parameters, buffers and submodules by
attribute, with PyTorch's dotted names and state_dict keys."""
from collections import OrderedDict

import numpy as np

from ..backend import asnumpy, to_device, xp_of
from .._tensor import Tensor
from .parameter import Parameter


class Module:
    """Base class: set Parameters and Modules as attributes; define forward."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

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

    def register_buffer(self, name, value):
        """Non-trainable state saved in state_dict (an array or Tensor)."""
        self._buffers[name] = value if isinstance(value, Tensor) else Tensor(value)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # -- traversal ---------------------------------------------------------------
    def named_modules(self, prefix=""):
        """(dotted name, module) for self and every submodule, in order."""
        stack, seen = [(prefix, self)], set()
        while stack:
            name, mod = stack.pop()
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            yield name, mod
            children = [(f"{name}.{k}" if name else k, m) for k, m in mod._modules.items()]
            stack.extend(reversed(children))

    def modules(self):
        return (m for _, m in self.named_modules())

    def children(self):
        return iter(self._modules.values())

    def _named(self, table, prefix=""):
        seen = set()
        for mod_name, mod in self.named_modules(prefix):
            for name, value in getattr(mod, table).items():
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))  # a shared parameter is listed once
                yield (f"{mod_name}.{name}" if mod_name else name), value

    def named_parameters(self, prefix=""):
        return self._named("_parameters", prefix)

    def parameters(self):
        return (p for _, p in self.named_parameters())

    def named_buffers(self, prefix=""):
        return self._named("_buffers", prefix)

    def apply(self, fn):
        for mod in self.modules():
            fn(mod)
        return self

    # -- modes and gradients -------------------------------------------------------
    def train(self, mode=True):
        for mod in self.modules():
            object.__setattr__(mod, "training", bool(mode))
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad[...] = 0

    def to(self, device):
        """Move every parameter and buffer to "cpu" or "gpu" (before training)."""
        for _, t in list(self.named_parameters()) + list(self.named_buffers()):
            t.data = to_device(t.data, device)
            t.grad = None if t.grad is None else to_device(t.grad, device)
        return self

    # -- state -------------------------------------------------------------------
    def _state_items(self):
        """(key, tensor) in PyTorch's state_dict order: a module's own
        parameters, then its buffers, then each child's, depth first. Unlike
        named_parameters(), a shared tensor appears under every name, as in
        PyTorch (tied weights give two keys)."""
        out, stack = [], [("", self)]
        while stack:
            prefix, mod = stack.pop()
            for table in (mod._parameters, mod._buffers):
                out.extend((prefix + k, t) for k, t in table.items() if t is not None)
            stack.extend(reversed([(f"{prefix}{k}.", m) for k, m in mod._modules.items()]))
        return out

    def state_dict(self):
        """{dotted name: NumPy copy} of parameters and buffers, PyTorch's keys."""
        return OrderedDict((k, np.array(asnumpy(t.data), copy=True))
                           for k, t in self._state_items())

    def load_state_dict(self, state, strict=True):
        """Copy arrays into parameters and buffers in place.

        With ``strict``, missing and unexpected keys raise KeyError listing
        them all; a shape mismatch always raises ValueError naming the entry
        and both shapes. Returns (missing, unexpected)."""
        own = OrderedDict(self._state_items())
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict for {type(self).__name__}: missing keys "
                           f"{missing}, unexpected keys {unexpected}")
        bad = [f"{k}: checkpoint {tuple(np.shape(state[k]))} vs model {own[k].shape}"
               for k in own if k in state and tuple(np.shape(state[k])) != own[k].shape]
        if bad:
            raise ValueError("load_state_dict: shape mismatch for " + "; ".join(bad))
        for k, t in own.items():
            if k in state:
                value = state[k].data if isinstance(state[k], Tensor) else state[k]
                xp = xp_of(t.data)
                t.data[...] = xp.asarray(value).astype(t.data.dtype, copy=False)
        return missing, unexpected

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"({k}): " + repr(m).replace("\n", "\n  ") for k, m in self._modules.items()]
        body = "\n  " + "\n  ".join(lines) + "\n" if lines else ""
        return f"{type(self).__name__}({self.extra_repr()}{body})"
