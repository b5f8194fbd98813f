"""PyTorch's ``torch.accelerator``: the one accelerator type spmdnet knows
is CUDA (through CuPy). Without a GPU ``current_accelerator()`` is None and
``device_count()`` 0, as PyTorch's on a CPU-only machine."""
from . import cuda
from ._device import device


def is_available():
    return cuda.is_available()


def current_accelerator(check_available=False):
    """``device(type='cuda')`` when a GPU is visible, else None."""
    return device("cuda") if cuda.is_available() else None


def device_count():
    return cuda.device_count()


def current_device_index():
    return cuda.current_device()


def set_device_index(index):
    cuda.set_device(index)


set_device_idx = set_device_index  # PyTorch's alias
current_device_idx = current_device_index  # PyTorch's alias


def synchronize(device=None):  # noqa: F811 - PyTorch's argument name shadows the class
    cuda.synchronize(device)
