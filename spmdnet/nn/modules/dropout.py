"""Dropout layers (PyTorch's ``torch.nn.modules.dropout``): each calls its
``F.*`` function with ``self.training``, so ``eval()`` makes it the identity.
``inplace=True`` is accepted for PyTorch's signatures; the result is the
same values, computed out of place."""
from .. import functional as F
from .module import Module


class _DropoutNd(Module):
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Dropout(_DropoutNd):
    """Zero each element with probability p, scale the rest by 1/(1-p)."""

    def forward(self, input):  # noqa: A002 - PyTorch's name
        return F.dropout(input, self.p, self.training)


class Dropout1d(_DropoutNd):
    """Zero whole channels of (N, C, L) or (C, L) input."""

    def forward(self, input):  # noqa: A002 - PyTorch's name
        return F.dropout1d(input, self.p, self.training)


class Dropout2d(_DropoutNd):
    """Zero whole channels of (N, C, H, W) or (C, H, W) input."""

    def forward(self, input):  # noqa: A002 - PyTorch's name
        return F.dropout2d(input, self.p, self.training)


class Dropout3d(_DropoutNd):
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W) input."""

    def forward(self, input):  # noqa: A002 - PyTorch's name
        return F.dropout3d(input, self.p, self.training)


class AlphaDropout(_DropoutNd):
    """Dropout that keeps a SELU network's mean and variance."""

    def forward(self, input):  # noqa: A002 - PyTorch's name
        return F.alpha_dropout(input, self.p, self.training)


class FeatureAlphaDropout(_DropoutNd):
    """``AlphaDropout`` of whole channels."""

    def forward(self, input):  # noqa: A002 - PyTorch's name
        return F.feature_alpha_dropout(input, self.p, self.training)
