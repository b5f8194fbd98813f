"""ZeRO stages 1 and 2: ``ZeroRedundancyOptimizer`` (``optimizer``), its
gradients reduce-scattered during backward for stage 2 (``grads``) and its
full optimizer state (``state``). Stage 3 is ``parallel.fsdp``."""
from .optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
