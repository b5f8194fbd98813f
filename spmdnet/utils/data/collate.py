"""``default_collate`` and ``default_convert``: PyTorch's rules for turning
samples into batches, on spmdnet's Tensors.

``default_collate(samples)`` looks at the first sample and recurses:
Tensors and NumPy arrays are stacked along a new first axis into a Tensor;
Python ints become an int64 Tensor, floats a float64 one, bools a bool one;
NumPy scalars keep their dtype; strings and bytes stay a sequence of
strings; a mapping becomes a mapping of batches (its own type where it can
be rebuilt), a namedtuple a namedtuple of batches, a tuple a *list* of
batches (as PyTorch does), any other sequence a sequence of its type.
Sequences in one batch must be equally long (RuntimeError otherwise);
anything else is a TypeError naming the type found.

``default_convert(sample)`` is what a loader without automatic batching
(``batch_size=None``) applies: NumPy arrays and scalars become Tensors, the
same containers are walked, everything else is kept.
"""
import collections.abc
import copy

import numpy as np

from ..._tensor import Tensor
from ...backend import xp_of

_STRINGS = (str, bytes)
_UNSUPPORTED = ("default_collate: batch must contain tensors, numpy arrays, numbers, dicts "
                "or lists; found {}")


def _stack(arrays):
    """One array with a new first axis; arrays of one module (NumPy or CuPy)."""
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise RuntimeError(f"stack expects each tensor to be equal size, but got shapes "
                           f"{sorted(shapes)} in one batch")
    return xp_of(arrays[0]).stack(arrays)


def _numpy_allowed(array):
    # strings and objects cannot become a numeric Tensor: PyTorch refuses them too
    if array.dtype.kind in "SaUO":
        raise TypeError(_UNSUPPORTED.format(array.dtype))


def _rebuild(sample, values):
    """A container like ``sample`` holding ``values`` (a dict of them for a
    mapping); a plain list/dict where the type cannot be rebuilt."""
    if isinstance(sample, collections.abc.Mapping):
        try:
            if isinstance(sample, collections.abc.MutableMapping):
                rebuilt = copy.copy(sample)
                rebuilt.update(values)
                return rebuilt
            return type(sample)(values)
        except TypeError:  # a mapping type without a copy or a dict constructor
            return dict(values)
    if isinstance(sample, tuple) and hasattr(sample, "_fields"):  # namedtuple
        return type(sample)(*values)
    if isinstance(sample, tuple):
        return list(values)  # PyTorch turns tuples into lists
    try:
        if isinstance(sample, collections.abc.MutableSequence):
            rebuilt = copy.copy(sample)
            rebuilt[:] = values
            return rebuilt
        return type(sample)(values)
    except TypeError:
        return list(values)


def default_collate(batch):
    """A batch (see the module's notes) from a list of samples."""
    first = batch[0]
    if isinstance(first, Tensor):
        return Tensor(_stack([t.array for t in batch]))
    if type(first).__module__ in ("numpy", "cupy") and not isinstance(first, _STRINGS):
        if isinstance(first, np.generic):
            _numpy_allowed(np.asarray(first))
            return Tensor(np.asarray(batch, dtype=first.dtype))
        _numpy_allowed(first)
        return Tensor(_stack(list(batch)))
    if isinstance(first, bool):
        return Tensor(np.asarray(batch, dtype=np.bool_))
    if isinstance(first, int):
        return Tensor(np.asarray(batch, dtype=np.int64))
    if isinstance(first, float):
        return Tensor(np.asarray(batch, dtype=np.float64))
    if isinstance(first, _STRINGS):
        return batch
    if isinstance(first, collections.abc.Mapping):
        return _rebuild(first, {key: default_collate([s[key] for s in batch])
                                for key in first})
    if isinstance(first, collections.abc.Sequence):
        sizes = {len(s) for s in batch}
        if len(sizes) > 1:
            raise RuntimeError("each element in list of batch should be of equal size "
                               f"(got sizes {sorted(sizes)})")
        return _rebuild(first, [default_collate(column) for column in zip(*batch)])
    raise TypeError(_UNSUPPORTED.format(type(first)))


def default_convert(data):
    """Tensors from the NumPy arrays and scalars in ``data`` (containers
    walked, everything else kept): the loader's collate without batching."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, np.ndarray):
        return data if data.dtype.kind in "SaUO" else Tensor(data)
    if isinstance(data, np.generic) and not isinstance(data, _STRINGS):
        return Tensor(np.asarray(data))
    if isinstance(data, _STRINGS):
        return data
    if isinstance(data, collections.abc.Mapping):
        return _rebuild(data, {key: default_convert(value) for key, value in data.items()})
    if isinstance(data, collections.abc.Sequence):
        return _rebuild(data, [default_convert(d) for d in data])
    return data
