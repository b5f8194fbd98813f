"""``nn.Upsample`` (PyTorch's ``torch.nn.modules.upsampling``)."""
from .. import functional as F
from .module import Module


class Upsample(Module):
    """PyTorch's ``nn.Upsample`` (mode 'nearest' only)."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x):
        return F.interpolate(x, self.size, self.scale_factor, self.mode,
                             recompute_scale_factor=self.recompute_scale_factor)
