"""Data, at PyTorch's ``torch.utils.data`` path: PyTorch's datasets,
samplers, ``default_collate`` and ``DataLoader`` (with worker processes),
``distributed.DistributedSampler``, spmdnet's HDF5 and token datasets, exact
evaluation and dataset writers. ``spmdnet.data`` is an alias of this package
(the same objects, submodules included)."""
from . import datasets, transforms
from .array import ArrayDataset
from .collate import default_collate, default_convert
from .dataset import (ChainDataset, ConcatDataset, Dataset, IterableDataset, StackDataset,
                      Subset, TensorDataset, random_split)
from .distributed import DistributedSampler
from .evaluation import evaluate, shard_indices
from .hdf5 import HDF5Dataset, check_same_features
from .dataloader import DataLoader
from .progressbar import progress
from .sampler import (BatchSampler, RandomSampler, Sampler, SequentialSampler,
                      SubsetRandomSampler, WeightedRandomSampler)
from .tokens import CharTokenizer, TokenDataset, unigram_entropy
from .worker import WorkerInfo, get_worker_info

__all__ = ["ArrayDataset", "HDF5Dataset", "check_same_features", "DistributedSampler",
           "DataLoader", "progress", "evaluate", "shard_indices", "datasets", "transforms",
           "CharTokenizer", "TokenDataset", "unigram_entropy",
           "Dataset", "IterableDataset", "TensorDataset", "StackDataset", "Subset", "ConcatDataset",
           "ChainDataset", "random_split", "default_collate", "default_convert",
           "Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler",
           "WeightedRandomSampler", "BatchSampler", "get_worker_info", "WorkerInfo"]
