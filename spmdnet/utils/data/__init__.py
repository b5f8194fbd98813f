"""Data, at PyTorch's ``torch.utils.data`` path: HDF5 and token datasets
beside the distributed sampler, the prefetching loader, exact evaluation
and dataset writers. ``spmdnet.data`` is an alias of this package (the same
objects, submodules included)."""
from . import datasets, transforms
from .array import ArrayDataset
from .evaluation import evaluate, shard_indices
from .hdf5 import HDF5Dataset, check_same_features
from .loader import DataLoader
from .progressbar import progress
from .sampler import DistributedSampler
from .tokens import CharTokenizer, TokenDataset, unigram_entropy

__all__ = ["ArrayDataset", "HDF5Dataset", "check_same_features", "DistributedSampler",
           "DataLoader", "progress", "evaluate", "shard_indices", "datasets", "transforms",
           "CharTokenizer", "TokenDataset", "unigram_entropy"]
