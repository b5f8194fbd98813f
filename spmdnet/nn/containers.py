"""Containers: ``Sequential``, ``ModuleList``, ``ModuleDict``, ``ParameterList``.

Children are registered as "0", "1", ... so state_dict keys are PyTorch's
("0.weight", "2.bias" for ``Sequential(Linear, ReLU, Linear)``).
"""
import operator
from collections import OrderedDict

from .. import functional as F
from .._tensor import Tensor
from .activation import GELU, ReLU, Sigmoid, Tanh
from .layers import Linear
from .module import Module
from .parameter import Parameter


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


# The attribute a wrapper sets on each module whose parameters it manages
# (its name, e.g. "FullyShardedDataParallel"): Sequential never fuses such a
# module, whose forward must run for the wrapper to gather its weights.
MANAGED_BY = "_spmdnet_managed_by"


class Sequential(ModuleSequence):
    """Modules applied in order: ``Sequential(a, b, c)(x)`` is ``c(b(a(x)))``;
    ``Sequential(OrderedDict(name=module, ...))`` names the children. A slice
    is a Sequential keeping the children's names (as PyTorch).

    Fusion, on by default: a ``Linear`` (the class itself, not a subclass)
    directly followed by ``ReLU``, ``GELU``, ``Tanh`` or ``Sigmoid`` runs as
    one op, ``F.linear(x, weight, bias, activation=...)``, with one pass over
    the product instead of three. Outputs and gradients are the same as
    calling the two modules in turn (tests/test_nn.py compares both in
    float64), but the activation module's ``forward`` is not called.
    ``fused_pairs()`` shows which modules fuse; ``fuse=False`` (or setting
    ``seq.fuse = False``) calls every module in turn, as does a Linear that a
    wrapper manages (``MANAGED_BY``, set by FullyShardedDataParallel).
    """

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
        if not self.fuse:
            return []
        modules, pairs, i = list(self), [], 0
        while i < len(modules) - 1:
            activation = _fusable_activation(modules[i + 1]) \
                if type(modules[i]) is Linear else None
            if activation is not None:
                pairs.append((i, activation))
            i += 2 if activation is not None else 1
        return pairs

    def forward(self, x):
        modules, fused, i = list(self), dict(self.fused_pairs()), 0
        while i < len(modules):
            m = modules[i]
            # a wrapper that manages the Linear's parameters (FSDP frees them
            # between uses and gathers them in the module's own forward) marks
            # it: the Linear runs itself; the shape test guards unmarked ones
            if i in fused and getattr(m, MANAGED_BY, None) is None and m.weight.ndim == 2:
                x = F.linear(x, m.weight, m.bias, activation=fused[i])
                i += 2
            else:
                x = m(x)
                i += 1
        return x

    def extra_repr(self):
        return "" if self.fuse else "fuse=False"


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
