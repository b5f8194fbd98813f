"""``nn.Linear`` and ``nn.Identity`` (PyTorch's ``torch.nn.modules.linear``).

``device`` ("cpu" or "gpu") and ``dtype`` (default: ``sn.get_default_dtype()``)
are accepted as in PyTorch; parameters are initialised on the host from
spmdnet's generator, then moved, so a seed gives the same weights anywhere.
"""
from .. import functional as F
from .. import init
from ..parameter import Parameter
from .module import Module
from .utils import _empty, _move


class Linear(Module):
    """y = x @ weight.T + bias; weight (out, in). PyTorch's default init:
    ``kaiming_uniform_(weight, a=sqrt(5))`` (that is U(±1/sqrt(in))) and bias
    U(±1/sqrt(in))."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        if in_features < 0 or out_features < 0:
            raise ValueError(f"Linear: negative size ({in_features}, {out_features})")
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(_empty((out_features, in_features), dtype, device))
        self.bias = Parameter(_empty((out_features,), dtype, device)) if bias else None
        self.reset_parameters()
        _move(self, device)

    def reset_parameters(self):
        init.default_layer_init_(self.weight, self.bias)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Identity(Module):
    """Returns its input; any constructor arguments are ignored (as PyTorch)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x
