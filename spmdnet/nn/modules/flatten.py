"""``nn.Flatten`` and ``nn.Unflatten`` (PyTorch's ``torch.nn.modules.flatten``)."""
from .module import Module


class Flatten(Module):
    """``x.flatten(start_dim, end_dim)``; by default keeps the batch dim."""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """``x.unflatten(dim, unflattened_size)``: one dim becomes several."""

    def __init__(self, dim, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        return x.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
