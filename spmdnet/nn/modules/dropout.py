"""Dropout layers (PyTorch's ``torch.nn.modules.dropout``)."""
from .. import functional as F
from .module import Module


class Dropout(Module):
    """Dropout in train mode, identity in eval mode."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"
