"""``torch.distributed.optim``'s path: ``ZeroRedundancyOptimizer``
(``zero_redundancy_optimizer.py``, PyTorch's file: ZeRO stage 1 with
PyTorch's arguments, and spmdnet's stage 2; also
``spmdnet.parallel.ZeroRedundancyOptimizer``, the same class), its full
optimizer state beside it (``zero_state.py``)."""
from .zero_redundancy_optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
