"""PyTorch's dataset classes: ``Dataset``, ``IterableDataset``,
``TensorDataset``, ``StackDataset``, ``Subset``, ``ConcatDataset``,
``ChainDataset`` and ``random_split``, plus the batched read the DataLoader uses for spmdnet's
own datasets (``batched.py``).

A map-style dataset answers ``len(ds)`` and ``ds[i]`` (one sample); it may
add ``__getitems__(indices) -> list of samples`` (PyTorch's contract: the
loader hands that list to ``collate_fn``). spmdnet's array-backed datasets
(``HDF5Dataset``, ``TokenDataset``, ``ArrayDataset``, ``TensorDataset`` and
a ``Subset`` of one) also read a whole index array at once
(``batched.read_batch``).

``random_split`` draws PyTorch's ``randperm`` from ``generator`` (a
``spmdnet.Generator``, or None: the current stream).
"""
import bisect
import math
import warnings

import numpy as np

from ... import random as sn_random
from ...random import distributions
from ..._tensor import Tensor


class Dataset:
    """A map-style dataset: subclasses define ``__getitem__`` (and usually
    ``__len__``). ``ds1 + ds2`` concatenates."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} is a Dataset subclass without "
                                  "__getitem__: define it to return sample `index`")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A stream of samples: subclasses define ``__iter__``. With loader
    workers, each worker iterates its own copy: shard the stream with
    ``get_worker_info()`` or every sample comes once per worker."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} is an IterableDataset subclass "
                                  "without __iter__")

    def __add__(self, other):
        return ChainDataset([self, other])


class TensorDataset(Dataset):
    """Sample ``i`` is ``tuple(t[i] for t in tensors)``; every tensor has the
    same first dimension."""

    def __init__(self, *tensors):
        sizes = [int(t.shape[0]) for t in tensors]
        if len(set(sizes)) > 1:
            raise ValueError(f"TensorDataset: size mismatch between tensors: first "
                             f"dimensions {sizes}")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __getitems__(self, indices):
        index = np.asarray(indices, dtype=np.int64)  # one fancy index per tensor
        columns = [t.array[index] if isinstance(t, Tensor) else np.asarray(t)[index]
                   for t in self.tensors]
        return [tuple(Tensor(c[k]) for c in columns) for k in range(len(index))]

    def __len__(self):
        return int(self.tensors[0].shape[0]) if self.tensors else 0


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, indices

    def __getitem__(self, index):
        if isinstance(index, list):
            return [self.dataset[self.indices[i]] for i in index]
        return self.dataset[self.indices[index]]

    def __getitems__(self, indices):
        inner = [self.indices[i] for i in indices]
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.dataset.__getitems__(inner)
        return [self.dataset[i] for i in inner]

    def __len__(self):
        return len(self.indices)


class StackDataset(Dataset):
    """Samples of several equally long datasets side by side: a tuple (given
    positionally) or a dict (given by keyword), as PyTorch's."""

    def __init__(self, *args, **kwargs):
        if args and kwargs:
            raise ValueError("Supported either ``tuple``- (via ``args``) or ``dict``- (via "
                             "``kwargs``) like input/output, but both types are given.")
        parts = args or tuple(kwargs.values())
        if not parts:
            raise ValueError("At least one dataset should be passed")
        lengths = [len(d) for d in parts]
        if len(set(lengths)) != 1:
            raise ValueError(f"Size mismatch between datasets: lengths {lengths}")
        self._length, self.datasets = lengths[0], (args if args else dict(kwargs))

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __len__(self):
        return self._length


class ConcatDataset(Dataset):
    """The samples of ``datasets`` one after the other."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError(f"ConcatDataset does not support IterableDataset "
                                f"({type(d).__name__}): use ChainDataset")
        self.cumulative_sizes = np.cumsum([len(d) for d in self.datasets]).tolist()

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, index):
        if index < 0:
            if -index > len(self):
                raise ValueError(f"absolute value of index should not exceed dataset "
                                 f"length: index {index}, length {len(self)}")
            index += len(self)
        which = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][index - start]


class ChainDataset(IterableDataset):
    """The streams of ``datasets`` one after the other."""

    def __init__(self, datasets):
        self.datasets = list(datasets)

    def __iter__(self):
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise TypeError(f"ChainDataset only supports IterableDataset, got "
                                f"{type(d).__name__}")
            yield from d

    def __len__(self):
        return sum(len(d) for d in self.datasets)


def _split_lengths(n, lengths):
    lengths = list(lengths)
    fractions = all(0 <= x <= 1 for x in lengths) and math.isclose(sum(lengths), 1)
    if fractions and sum(lengths) != n:
        counts = [int(math.floor(n * f)) for f in lengths]
        for k in range(n - sum(counts)):  # the remainder, one each, round-robin
            counts[k % len(counts)] += 1
        for i, count in enumerate(counts):
            if count == 0:
                warnings.warn(f"random_split: length of split at index {i} is 0: this "
                              "split will be empty", stacklevel=3)
        lengths = counts
    if sum(lengths) != n:
        raise ValueError(f"random_split: the lengths {lengths} sum to {sum(lengths)}, not "
                         f"to the dataset's length {n}")
    return [int(x) for x in lengths]


def random_split(dataset, lengths, generator=None):
    """Non-overlapping random ``Subset``s of the given lengths (or fractions
    summing to 1: floors, the remainder spread one by one from the first)."""
    lengths = _split_lengths(len(dataset), lengths)
    g = sn_random.resolve(generator, "random_split")
    order = distributions.randperm(g, sum(lengths)).tolist()
    bounds = np.cumsum([0] + lengths).tolist()
    return [Subset(dataset, order[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
