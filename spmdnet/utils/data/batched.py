"""The batched read of spmdnet's array-backed datasets: ``HDF5Dataset``,
``TokenDataset``, ``ArrayDataset``, ``TensorDataset`` and a ``Subset`` of
one read a whole index array with one fancy index (one HDF5 read). The
loader uses it only with the default collate, whose result on the per-item
samples it equals (see ``dataloader.py``)."""
import numpy as np

from ..._tensor import Tensor
from .array import ArrayDataset
from .dataset import Subset, TensorDataset
from .hdf5 import HDF5Dataset
from .tokens import TokenDataset

_ARRAY_BACKED = (ArrayDataset, HDF5Dataset, TokenDataset)


def reads_batches(dataset):
    """True when ``read_batch`` reads ``dataset`` one index array at a time."""
    if isinstance(dataset, TensorDataset):
        return all(isinstance(t, Tensor) or hasattr(t, "__array__") for t in dataset.tensors)
    if isinstance(dataset, Subset):
        return reads_batches(dataset.dataset)
    return isinstance(dataset, _ARRAY_BACKED)


def read_batch(dataset, index):
    """The columns (a tuple of arrays, ``None`` for a missing label) of the
    samples at ``index`` (an int64 array): what stacking the per-item
    samples' fields would give, read at once."""
    if isinstance(dataset, TensorDataset):
        return tuple(t.array[index] if isinstance(t, Tensor) else np.asarray(t)[index]
                     for t in dataset.tensors)
    if isinstance(dataset, Subset):
        return read_batch(dataset.dataset, np.asarray(dataset.indices, dtype=np.int64)[index])
    columns = dataset[index]
    return tuple(c.array if isinstance(c, Tensor) else c for c in columns)
