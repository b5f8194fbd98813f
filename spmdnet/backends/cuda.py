"""``torch.backends.cuda``: ``matmul.allow_tf32`` (False, PyTorch's default)
and ``is_built()``. Stored only: see ``spmdnet.backends``."""
from .. import backend


class _MatmulFlags:
    """``backends.cuda.matmul``: ``allow_tf32``, ``allow_fp16_reduced_precision_reduction``
    and ``allow_bf16_reduced_precision_reduction`` with PyTorch's defaults."""

    def __init__(self):
        self.allow_tf32 = False
        self.allow_fp16_reduced_precision_reduction = True
        self.allow_bf16_reduced_precision_reduction = True


matmul = _MatmulFlags()


def is_built():
    """True when CuPy imports (spmdnet's CUDA support is CuPy)."""
    return backend._load_cupy() is not None
