"""``fully_shard``'s policies: ``MixedPrecisionPolicy``, ``OffloadPolicy``,
``CPUOffloadPolicy`` (PyTorch's names and fields)."""
import dataclasses

import numpy as np

from ...dtypes import is_floating


def _check_dtype(field, value):
    if value is None:
        return None
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise TypeError(f"MixedPrecisionPolicy({field}={value!r}): not a dtype") from None
    if not is_floating(dtype):
        raise TypeError(f"MixedPrecisionPolicy({field}={value!r}): a floating dtype "
                        "(float64, float32, float16, bfloat16) is needed")
    return dtype


@dataclasses.dataclass(frozen=True)
class MixedPrecisionPolicy:
    """``param_dtype``: the dtype the unsharded parameters (and so forward
    and backward) use; ``reduce_dtype``: the gradients' dtype in the
    reduce-scatter (default ``param_dtype``); ``output_dtype``: the dtype
    floating outputs are cast to; ``cast_forward_inputs``: cast floating
    inputs to ``param_dtype``. The sharded parameters keep their dtype."""
    param_dtype: object = None
    reduce_dtype: object = None
    output_dtype: object = None
    cast_forward_inputs: bool = True

    def __post_init__(self):
        for field in ("param_dtype", "reduce_dtype", "output_dtype"):
            object.__setattr__(self, field, _check_dtype(field, getattr(self, field)))


@dataclasses.dataclass
class OffloadPolicy:
    """No offloading (the default)."""


@dataclasses.dataclass
class CPUOffloadPolicy(OffloadPolicy):
    """Sharded parameters, their gradients and so the optimizer step on the
    host (NumPy arrays; page-locked when ``pin_memory`` and they came from a
    GPU); every all-gather copies them to the compute device first. On the
    CPU backend parameters already live on the host: nothing moves."""
    pin_memory: bool = True
