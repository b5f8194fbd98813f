"""ZeRO stages 1 and 2: ``ZeroRedundancyOptimizer`` (``optimizer``: its
parameters in a ``ParamAndGradBuffer``, whose buckets reduce-scatter the
gradients during backward for stage 2) and its full optimizer state
(``state``). Stage 3 is ``parallel.fsdp``."""
from .optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
