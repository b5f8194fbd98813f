"""PyTorch's ``torch.backends`` flags: ``backends.cuda.matmul.allow_tf32``,
``backends.cudnn.{benchmark, deterministic, enabled, allow_tf32}`` and
``backends.mps.is_available()``. Programs set them; spmdnet keeps the values
(so reading them back gives what was set) and its kernels do not consult
them: CuPy's matmul follows CuPy's own settings, and spmdnet has no cuDNN."""
from . import cuda, cudnn, mps  # noqa: F401 - the submodules, as torch.backends'
