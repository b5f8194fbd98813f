"""PyTorch's mixed precision API (``torch.amp``): ``autocast`` and
``GradScaler``, as far as spmdnet honestly goes.

CPU autocast to bfloat16 (``autocast("cpu")``, ``dtype`` bfloat16, PyTorch's
CPU default) runs as PyTorch's: matrix products, linear layers and
convolutions take bfloat16-rounded inputs and return bfloat16, the losses
compute in float32, the rest in their inputs' dtypes (``spmdnet/_precision.py``
holds the op lists and the per-op float32-and-round rule). Otherwise:

- ``enabled=False`` behaves exactly as PyTorch's disabled objects (the
  context runs its block unchanged, the scaler passes losses and steps
  through, ``get_scale()`` is 1.0, ``state_dict()`` is empty);
- where PyTorch disables them itself (``"cuda"`` without a GPU) they are
  disabled with PyTorch's warning text;
- where PyTorch would compute in float16 (CPU autocast to float16, CUDA
  autocast on a GPU) or scale float16 gradients, they raise
  NotImplementedError: a silent no-op would pretend to save memory and time.
"""
import functools
import warnings

import numpy as np

from .. import _precision, backend
from ..dtypes import bfloat16

DEVICE_TYPES = ("cpu", "cuda")
_CUDA_AUTOCAST_OFF = "CUDA is not available or torch_xla is imported. Disabling autocast."
_CUDA_SCALER_OFF = "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling."


def _device_type(device_type, what):
    name = str(device_type).partition(":")[0]
    if name not in DEVICE_TYPES:
        raise ValueError(f"{what}: device_type must be one of {DEVICE_TYPES}, "
                         f"got {device_type!r}")
    return name


def is_autocast_available(device_type):
    """True for the device types autocast accepts (``"cpu"``, ``"cuda"``)."""
    return str(device_type).partition(":")[0] in DEVICE_TYPES


def is_autocast_enabled(device_type=None):
    """Whether an enabled autocast block for ``device_type`` (default
    ``"cuda"``, as PyTorch's no-argument form) is running: only CPU autocast
    to bfloat16 ever is."""
    device = _device_type(device_type or "cuda", "is_autocast_enabled")
    return _precision.autocast_dtype(device) is not None


def get_autocast_dtype(device_type):
    """The dtype autocast for ``device_type`` computes in: the innermost
    enabled block's, else PyTorch's default (bfloat16 on the CPU, float16 on
    CUDA)."""
    device = _device_type(device_type, "get_autocast_dtype")
    dtype = _precision.autocast_dtype(device)
    if dtype is not None:
        return dtype
    return bfloat16 if device == "cpu" else np.dtype(np.float16)


class autocast:  # noqa: N801 - PyTorch's name
    """``autocast(device_type, dtype=None, enabled=True, cache_enabled=None)``
    as a context manager or decorator; see the module docstring for what an
    enabled one does."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        self.device = _device_type(device_type, "autocast")
        self.fast_dtype, self._cache_enabled = dtype, cache_enabled
        self._enabled = bool(enabled)
        if self._enabled and self.device == "cuda" and not backend.cupy_available():
            warnings.warn(_CUDA_AUTOCAST_OFF, UserWarning, stacklevel=2)
            self._enabled = False
        if self._enabled:
            precision = np.dtype(dtype) if dtype is not None else (
                bfloat16 if self.device == "cpu" else np.dtype(np.float16))
            if self.device != "cpu" or precision != bfloat16:
                raise NotImplementedError(
                    f"autocast({self.device!r}) would compute in {precision}, and spmdnet's "
                    "autocast computes in bfloat16 on the CPU only: run in float32 (pass "
                    "enabled=False, or drop the autocast block)")
            self.fast_dtype = precision

    def __enter__(self):
        # a disabled block inside an enabled one turns autocast off for its ops
        _precision.autocast_state.append((self.device,
                                          self.fast_dtype if self._enabled else None))
        return self

    def __exit__(self, *exc):
        _precision.autocast_state.pop()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def in_autocast(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        return in_autocast


class GradScaler:
    """``GradScaler(device="cuda", init_scale=2.**16, growth_factor=2.0,
    backoff_factor=0.5, growth_interval=2000, enabled=True)``.

    Disabled (``enabled=False``, or ``"cuda"`` without a GPU, with PyTorch's
    warning) it is PyTorch's disabled scaler: ``scale(x)`` returns ``x``,
    ``step(opt)`` returns ``opt.step()``, ``unscale_``/``update`` do nothing.
    An enabled one raises NotImplementedError: loss scaling exists for float16
    gradients, which spmdnet does not compute.
    """

    def __init__(self, device="cuda", init_scale=2.0**16, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000, enabled=True):
        self._device = _device_type(device, "GradScaler")
        self._init_scale, self._growth_factor = float(init_scale), float(growth_factor)
        self._backoff_factor, self._growth_interval = float(backoff_factor), int(growth_interval)
        self._enabled = bool(enabled)
        if self._enabled and self._device == "cuda" and not backend.cupy_available():
            warnings.warn(_CUDA_SCALER_OFF, UserWarning, stacklevel=2)
            self._enabled = False
        if self._enabled:
            raise NotImplementedError(
                f"GradScaler({self._device!r}) scales float16 gradients, and spmdnet has no "
                "float16 autocast yet: train in float32 and pass enabled=False")

    def is_enabled(self):
        return self._enabled

    def scale(self, outputs):
        return outputs

    def unscale_(self, optimizer):
        return None

    def step(self, optimizer, *args, **kwargs):
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        return None

    def get_scale(self):
        return 1.0

    def get_growth_factor(self):
        return self._growth_factor

    def get_backoff_factor(self):
        return self._backoff_factor

    def get_growth_interval(self):
        return self._growth_interval

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        return None
