"""``spmdnet.utils``: PyTorch's ``torch.utils`` home; ``spmdnet.utils.data`` holds
the datasets, samplers and loaders (``spmdnet.data`` is an alias of it)."""
from . import data

__all__ = ["data"]
