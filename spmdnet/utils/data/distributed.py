"""DistributedSampler (PyTorch's ``torch.utils.data.distributed`` path): which
sample indices each rank reads, PyTorch's rules and arguments, and ``comm=``
(the data-parallel communicator; default: the world) when ``num_replicas`` or
``rank`` is left out.

Pure index arithmetic, identical on every rank (no communication needed):
1. ``perm = randperm(n, generator=Generator().manual_seed(seed + epoch))``,
   PyTorch's numbers (or ``arange(n)`` without shuffling), the same on
   every rank;
2. without ``drop_last``, pad by repeating indices from the start until the
   length divides by ``num_replicas``; with it, cut the tail;
3. rank r takes ``indices[r::num_replicas]`` (strided, not contiguous).
To reproduce an order outside spmdnet, apply those three steps with the same
generator. Call ``set_epoch(epoch)`` every epoch, or every epoch repeats the
same order.

Resuming mid-epoch (as torchdata's ``StatefulDistributedSampler``): the
position is ``(epoch, start_index)``, ``start_index`` being how many of this
rank's indices of that epoch are already used; it is the same on every rank,
whose shares are equally long. ``state_dict()`` holds the position and what
the order depends on, ``load_state_dict`` restores the position and raises
``ValueError`` when the order would differ. ``DataLoader.state_dict()``
advances the position by the batches it has delivered: checkpoint the
loader's state, not the sampler's, in a training loop.
"""
import math

import numpy as np

from ... import random as sn_random
from ...distributed import comm_or_default
from ...random import distributions
from .sampler import Sampler

# what the order depends on: a state must match these to be loaded
_ORDER_KEYS = ("dataset_len", "num_replicas", "seed", "shuffle", "drop_last")


def _length(dataset):
    if isinstance(dataset, (int, np.integer)):
        return int(dataset)
    return len(dataset)


def _world(num_replicas, rank, comm):
    if num_replicas is not None and rank is not None:
        return num_replicas, rank
    comm = comm_or_default(comm)
    return (comm.Get_size() if num_replicas is None else num_replicas,
            comm.Get_rank() if rank is None else rank)


class DistributedSampler(Sampler):
    """Indices of this rank's share of ``dataset`` (or of ``range(n)`` for an
    int ``n``)."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False, comm=None):
        num_replicas, rank = _world(num_replicas, rank, comm)
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is out of range: valid ranks are "
                             f"[0, {num_replicas - 1}] for num_replicas={num_replicas}")
        self.dataset, self.dataset_len = dataset, _length(dataset)
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.epoch, self.start_index = 0, 0
        # a dataset whose items change per epoch (TokenDataset's random windows)
        # follows the sampler's epoch, on set_epoch and on resume alike
        self._dataset_epoch = getattr(dataset, "set_epoch", None)
        if drop_last and self.dataset_len < num_replicas:
            raise ValueError(f"{_describe(dataset)} has {self.dataset_len} samples, fewer "
                             f"than the {num_replicas} ranks: with drop_last every rank "
                             "would get nothing")
        if drop_last:
            self.num_samples = self.dataset_len // num_replicas
        else:
            self.num_samples = math.ceil(self.dataset_len / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch):
        """Use the permutation of ``epoch`` (seeded ``seed + epoch``), and tell
        the dataset when it has ``set_epoch`` too. A new epoch starts from its
        first index: a start index set for a resumed epoch is kept only while
        the epoch stays the same."""
        if int(epoch) != self.epoch:
            self.start_index = 0
        self.epoch = int(epoch)
        if self._dataset_epoch is not None:
            self._dataset_epoch(self.epoch)

    def set_start_index(self, start):
        """Skip this rank's first ``start`` indices of the current epoch (resume
        mid-epoch; the same on every rank, whose shares are equally long)."""
        if not 0 <= start <= self.num_samples:
            raise ValueError(f"start index {start} outside [0, {self.num_samples}]")
        self.start_index = int(start)

    def global_indices(self):
        """The padded or cut order of all ranks' indices, before striding."""
        n = self.dataset_len
        if self.shuffle:
            g = sn_random.Generator().manual_seed(self.seed + self.epoch)
            indices = distributions.randperm(g, n)
        else:
            indices = np.arange(n)
        if self.drop_last:
            return indices[:self.total_size]
        pad = self.total_size - n
        if pad and n:
            indices = np.concatenate([indices, np.resize(indices, pad)])
        return indices

    def indices(self):
        """This rank's indices for the current epoch (an int64 array)."""
        mine = self.global_indices()[self.rank:self.total_size:self.num_replicas]
        return mine[self.start_index:].astype(np.int64)

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        return self.num_samples - self.start_index

    def state_dict(self):
        """The position (``epoch``, ``start_index``) and what the order depends
        on; JSON-serialisable and the same on every rank."""
        return {"epoch": self.epoch, "start_index": self.start_index,
                **{key: getattr(self, key) for key in _ORDER_KEYS}}

    def load_state_dict(self, state):
        """Continue at the position of ``state``. Raises ValueError, naming the
        values, when the state comes from a sampler with another order
        (dataset length, num_replicas, seed, shuffle or drop_last); keys absent
        from an older state are not checked."""
        differ = [f"{key} {state[key]!r} in the state, {getattr(self, key)!r} here"
                  for key in _ORDER_KEYS if key in state and state[key] != getattr(self, key)]
        if differ:
            raise ValueError("cannot resume this DistributedSampler from a sampler with "
                             f"another order: {'; '.join(differ)}")
        self.set_epoch(state["epoch"])
        self.set_start_index(state["start_index"])


def _describe(ds):
    path = getattr(ds, "path", None)
    if path is None:
        return "the dataset"
    return f"dataset {path} (key {getattr(ds, 'x_key', '?')!r})"
