"""Containers: ``Sequential``, ``ModuleList``, ``ModuleDict``, ``ParameterList``.

Children are registered as "0", "1", ... so state_dict keys are PyTorch's
("0.weight", "2.bias" for ``Sequential(Linear, ReLU, Linear)``).
"""
import operator
from collections import OrderedDict

from .. import functional as F
from ..._tensor import Tensor
from .activation import GELU, ReLU, Sigmoid, Tanh
from .linear import Linear
from . import _hooks
from .module import Module
from ..parameter import Parameter


def _position(i, n):
    """A list position for index ``i`` of ``n`` items (negative counts from the end)."""
    i = operator.index(i)
    if not -n <= i < n:
        raise IndexError(f"index {i} is out of range")
    return i % n


class ModuleSequence(Module):
    """Modules in order, registered as "0", "1", ...: indexing (an int,
    negative from the end, or a slice), ``len``, iteration, ``append``,
    ``extend``, ``insert``. The base of ``Sequential`` and ``ModuleList``."""

    def __init__(self, modules=()):
        super().__init__()
        self.extend(modules)

    def append(self, module):
        """Register ``module`` under the next index; returns self."""
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        """Insert ``module`` before position ``index`` (renumbering the rest)."""
        items = list(self._modules.values())
        items.insert(index, module)
        self._renumber(items)

    def _renumber(self, items):
        self._modules.clear()
        for i, m in enumerate(items):
            self._modules[str(i)] = m

    def _key(self, i):
        return list(self._modules)[_position(i, len(self._modules))]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return type(self)(list(self._modules.values())[i])
        return self._modules[self._key(i)]

    def __setitem__(self, i, module):
        setattr(self, self._key(i), module)

    def __delitem__(self, i):
        keys = list(self._modules)[i] if isinstance(i, slice) else [self._key(i)]
        for k in keys:
            del self._modules[k]
        self._renumber(list(self._modules.values()))  # PyTorch keeps "0", "1", ...

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleList(ModuleSequence):
    """A list of modules; it has no forward of its own. A slice is a ModuleList."""

    def __iadd__(self, modules):
        return self.extend(modules)


class Sequential(ModuleSequence):
    """Modules applied in order: ``Sequential(a, b, c)(x)`` is ``c(b(a(x)))``;
    ``Sequential(OrderedDict(name=module, ...))`` names the children. A slice
    is a Sequential keeping the children's names (as PyTorch).

    Fusion, on by default, only where nothing can observe it: a ``Linear``
    (the class itself, not a subclass) directly followed by ``ReLU``,
    ``GELU``, ``Tanh`` or ``Sigmoid`` (the classes themselves) runs as one op,
    ``F.linear(x, weight, bias, activation=...)``, with one pass over the
    product instead of three, when neither module has a hook or an
    instance-assigned ``forward`` and no global module hook is registered (a
    wrapper that must see a module run, as FullyShardedDataParallel gathering a
    unit's weights, registers hooks on it). Outputs and gradients are the same as calling
    the two modules in turn (tests/test_nn.py compares both in float64);
    otherwise every module is called, hooks and all. ``fused_pairs()`` shows
    which modules fuse now; ``fuse=False`` (or ``seq.fuse = False``) calls
    every module in turn.
    """

    fuse = True  # also for a Sequential unpickled from PyTorch's (no such attribute)

    def __init__(self, *modules, fuse=True):
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            super().__init__()
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            super().__init__(modules)
        self.fuse = fuse

    def __getitem__(self, i):
        if isinstance(i, slice):
            return type(self)(OrderedDict(list(self._modules.items())[i]), fuse=self.fuse)
        return super().__getitem__(i)

    def fused_pairs(self):
        """[(i, activation)]: module i, a Linear, runs fused with module i + 1."""
        modules = list(self._modules.values())
        return [(i, act) for i, _, act in self._plan(modules) if act is not None]

    def _plan(self, modules):
        """(index, module, fused activation or None) for each step of forward."""
        fuse = self.fuse and not _hooks.GLOBAL_ACTIVE[0]
        i, n = 0, len(modules)
        while i < n:
            m = modules[i]
            act = None
            if fuse and i + 1 < n and type(m) is Linear and m.weight.ndim == 2 \
                    and not _observed(m) and not _observed(modules[i + 1]):
                act = _fusable_activation(modules[i + 1])
            yield i, m, act
            i += 1 if act is None else 2

    def forward(self, x):
        for _, m, act in self._plan(list(self._modules.values())):
            x = m(x) if act is None else F.linear(x, m.weight, m.bias, activation=act)
        return x

    def extra_repr(self):
        return "" if self.fuse else "fuse=False"


def _observed(module):
    """True when something would see a module's own forward run: a hook
    (a user's, or a wrapper's such as FSDP gathering the unit's weights) or a
    ``forward`` assigned onto the instance."""
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or "forward" in module.__dict__)


def _fusable_activation(module):
    """The ``F.linear`` activation name for an activation module, else None."""
    kind = type(module)
    if kind is GELU:
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    return {ReLU: "relu", Tanh: "tanh", Sigmoid: "sigmoid"}.get(kind)


class ModuleDict(Module):
    """Modules by name, in insertion order: ``d[name]``, ``d[name] = m``,
    ``del d[name]``, ``in``, ``len``, iteration over the names, ``keys``,
    ``values``, ``items``, ``update``, ``pop``, ``clear``."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def update(self, modules):
        """Add (name, module) pairs from a mapping or an iterable of pairs."""
        pairs = modules.items() if hasattr(modules, "items") else modules
        for key, module in pairs:
            self[key] = module

    def pop(self, key):
        module = self[key]
        del self[key]
        return module

    def clear(self):
        self._modules.clear()


class ParameterList(Module):
    """Parameters registered as "0", "1", ...: indexing, ``len``, iteration,
    ``append``, ``extend``. A plain Tensor or array becomes a Parameter."""

    def __init__(self, values=None):
        super().__init__()
        self.extend(values or ())

    @staticmethod
    def _as_parameter(value):
        return value if isinstance(value, Parameter) or value is None else \
            Parameter(value.array if isinstance(value, Tensor) else value)

    def append(self, value):
        self.register_parameter(str(len(self._parameters)), self._as_parameter(value))
        return self

    def extend(self, values):
        for v in values:
            self.append(v)
        return self

    def __getitem__(self, i):
        if isinstance(i, slice):
            return type(self)(list(self._parameters.values())[i])
        return self._parameters[str(_position(i, len(self._parameters)))]

    def __setitem__(self, i, value):
        self._parameters[str(_position(i, len(self._parameters)))] = self._as_parameter(value)

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters.values())

    def __iadd__(self, values):
        return self.extend(values)

    def extra_repr(self):
        return "\n".join(f"({i}): Parameter of shape {tuple(p.shape)}"
                         for i, p in enumerate(self) if p is not None)
