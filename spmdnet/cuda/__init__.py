"""PyTorch's ``torch.cuda``, answered from CuPy: ``is_available()`` is
False and ``device_count()`` 0 on a machine without CuPy or without a GPU.

Each MPI rank binds one GPU (the distributed runtime does it at start, from
the rank's local index), so ``current_device()`` is that rank's GPU and
``set_device`` only changes it for the rest of this process. Calls that need
a GPU (``current_device``, ``set_device``, ``synchronize``,
``get_device_name``) raise RuntimeError without one; the memory counters
answer 0, as PyTorch's do before CUDA starts.
"""
from .. import backend
from .. import random as _random
from .._device import device as _device
from . import amp  # noqa: F401 - torch.cuda.amp: PyTorch's older path of spmdnet.amp


def is_available():
    """True when CuPy imports and sees at least one GPU."""
    return backend.cupy_available()


def device_count():
    """How many GPUs CuPy sees (0 without CuPy)."""
    return backend.gpu_count()


def _cupy(what):
    if not is_available():
        raise RuntimeError(f"spmdnet.cuda.{what}() needs a CUDA GPU, and none is available "
                           "(CuPy missing or no device visible)")
    return backend.require_cupy()


def _ordinal(dev, what):
    """The CUDA ordinal of ``dev`` (int, "cuda:N", device; None = current)."""
    if dev is None:
        return current_device()
    if isinstance(dev, int) and not isinstance(dev, bool):
        return dev
    dev = _device(dev)
    if dev.type != "cuda":
        raise ValueError(f"spmdnet.cuda.{what}() takes a CUDA device, got {dev!r}")
    return current_device() if dev.index is None else dev.index


def current_device():
    """The ordinal of this process's current GPU."""
    return int(_cupy("current_device").cuda.runtime.getDevice())


def set_device(dev):
    """Make GPU ``dev`` (int, "cuda:N" or device) current for this process."""
    _cupy("set_device")
    backend.use_gpu(_ordinal(dev, "set_device"))


def synchronize(dev=None):
    """Wait for every kernel queued on the GPU ``dev`` (default: current)."""
    cp = _cupy("synchronize")
    with cp.cuda.Device(_ordinal(dev, "synchronize")):
        cp.cuda.runtime.deviceSynchronize()


def get_device_name(dev=None):
    """The GPU's product name, e.g. ``"NVIDIA H100 80GB HBM3"``."""
    cp = _cupy("get_device_name")
    name = cp.cuda.runtime.getDeviceProperties(_ordinal(dev, "get_device_name"))["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def get_device_capability(dev=None):
    """(major, minor) compute capability of the GPU."""
    cp = _cupy("get_device_capability")
    cc = cp.cuda.Device(_ordinal(dev, "get_device_capability")).compute_capability
    return int(cc[:-1]), int(cc[-1])


def is_bf16_supported(including_emulation=True):
    """False: CuPy has no bfloat16, so spmdnet computes none on a GPU, whatever
    the GPU supports (CPU tensors have ``spmdnet.bfloat16``, and CPU autocast
    to it runs); programs that ask then pick float16 or float32 on the GPU."""
    return False


def manual_seed(seed):
    """Seed the GPU generator only (PyTorch's meaning); without a GPU nothing
    happens, as PyTorch defers it until CUDA starts and it never does."""
    if is_available():
        _random._state["device_rng"] = backend.require_cupy().random.default_rng(int(seed))


def manual_seed_all(seed):
    """The same seed for every GPU: one GPU per rank, so ``manual_seed``."""
    manual_seed(seed)


def empty_cache():
    """Return CuPy's cached, unused GPU blocks to the driver (no-op without GPU)."""
    if is_available():
        backend.require_cupy().get_default_memory_pool().free_all_blocks()


def memory_allocated(dev=None):
    """Bytes held by live CuPy arrays (CuPy's default pool; 0 without GPU)."""
    if not is_available():
        return 0
    cp = backend.require_cupy()
    with cp.cuda.Device(_ordinal(dev, "memory_allocated")):
        return int(cp.get_default_memory_pool().used_bytes())


def memory_reserved(dev=None):
    """Bytes CuPy's default pool holds from the driver (0 without GPU)."""
    if not is_available():
        return 0
    cp = backend.require_cupy()
    with cp.cuda.Device(_ordinal(dev, "memory_reserved")):
        return int(cp.get_default_memory_pool().total_bytes())


class device:  # noqa: N801 - PyTorch's name: torch.cuda.device(i) as a context
    """``with spmdnet.cuda.device(i):`` makes GPU ``i`` current inside the block."""

    def __init__(self, dev):
        self.index = None if dev is None else _ordinal(dev, "device")
        self._previous = None

    def __enter__(self):
        if self.index is not None:
            self._previous = current_device()
            backend.use_gpu(self.index)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            backend.use_gpu(self._previous)
        return False
