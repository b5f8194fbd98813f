"""Helpers the layers share: a host array for a parameter and the
``device=`` move every constructor ends with (PyTorch's file of the same
name holds its layers' small helpers likewise)."""
import numpy as np

from ..._args import resolve_device
from ..._device import builds_on_meta, meta_array
from ..._tensor import get_default_dtype


def _empty(shape, dtype=None, device=None):
    """A host array for a parameter, filled by ``reset_parameters``; for
    ``device="meta"`` (or under ``with device("meta")``) a shape-only one, so
    the constructor's init draws nothing (PyTorch's ``nn.Linear(..., device="meta")``)."""
    dtype = np.dtype(dtype or get_default_dtype())
    if builds_on_meta() if device is None else \
            resolve_device(device, use_default=False) == "meta":
        return meta_array(shape, dtype)  # never np.empty of the data's size
    return np.empty(shape, dtype)


def _move(module, device):
    """The constructor's ``device=``: its tensors move there (to the meta
    device, each becomes shape-only: buffers made without ``_empty`` too)."""
    if device is None:
        return
    if resolve_device(device, use_default=False) == "meta":
        module.to_empty(device="meta")
    else:
        module.to(device)
