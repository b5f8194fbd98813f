"""Containers: ``Sequential`` and ``ModuleList``, one base class.

Children are registered as "0", "1", ... so state_dict keys are PyTorch's
("0.weight", "2.bias" for ``Sequential(Linear, ReLU, Linear)``).
"""
from .. import functional as F
from .layers import GELU, Linear, ReLU, Sigmoid, Tanh
from .module import Module


class ModuleSequence(Module):
    """Modules in order, registered as "0", "1", ...: indexing, ``len``,
    iteration and ``append``. The base of ``Sequential`` and ``ModuleList``."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module):
        """Register ``module`` under the next index; returns self."""
        setattr(self, str(len(self._modules)), module)
        return self

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleList(ModuleSequence):
    """A list of modules; it has no forward of its own."""


class Sequential(ModuleSequence):
    """Modules applied in order: ``Sequential(a, b, c)(x)`` is ``c(b(a(x)))``.

    Fusion, on by default: a ``Linear`` (the class itself, not a subclass)
    directly followed by ``ReLU``, ``GELU``, ``Tanh`` or ``Sigmoid`` runs as
    one op, ``F.linear(x, weight, bias, activation=...)``, with one pass over
    the product instead of three. Outputs and gradients are the same as
    calling the two modules in turn (tests/test_nn.py compares both in
    float64), but the activation module's ``forward`` is not called.
    ``fused_pairs()`` shows which modules fuse; ``fuse=False`` (or setting
    ``seq.fuse = False``) calls every module in turn.
    """

    def __init__(self, *modules, fuse=True):
        super().__init__(modules)
        self.fuse = fuse

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
            if i in fused:
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
