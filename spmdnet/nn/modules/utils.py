"""Helpers the layers share: a host array for a parameter and the
``device=`` move every constructor ends with (PyTorch's file of the same
name holds its layers' small helpers likewise)."""
import numpy as np

from ..._tensor import get_default_dtype


def _empty(shape, dtype=None):
    """A host array for a parameter, filled by ``reset_parameters``."""
    return np.empty(shape, np.dtype(dtype or get_default_dtype()))


def _move(module, device):
    if device is not None:
        module.to(device)
