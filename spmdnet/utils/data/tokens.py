"""Token data for language models: a character-level tokenizer and
``TokenDataset``, next-token windows over a 1-D HDF5 array of token ids.

A sample is a window of ``block_size + 1`` consecutive tokens: ``x`` its
first ``block_size`` tokens, ``y`` the next-token targets (the window
shifted by one). ``windows="all"`` takes every start position
(``n - block_size`` samples, overlapping: the usual GPT sampling, shuffled
per epoch by the DistributedSampler); ``windows="strided"`` takes
non-overlapping windows at starts ``0, block_size, 2 * block_size, ...``
(``(n - 1) // block_size`` samples: every target predicted once, for an
exact validation loss); ``windows="random"`` takes as many windows as
"strided" but each starts at a random offset, drawn afresh per epoch
(``set_epoch``) from ``seed`` and the epoch alone, so every rank and every
resumed run sees the same windows. Indexed like ``HDF5Dataset`` (``len(ds)``,
``ds[index_array] -> (x, y)``, int64), so ``DistributedSampler``,
``DataLoader`` and ``evaluate`` work unchanged.

``CORPUS`` is the text the package ships (public-domain prose): the default
corpus of ``datasets.make_text`` and ``examples/gpt/``'s trainers, identical on
every machine and needing no download.
"""
import os
from pathlib import Path

import numpy as np

from ...distributed import rank_label
from .dataset import Dataset
from .hdf5 import _h5py

CORPUS = Path(__file__).with_name("corpus.txt")
WINDOWS = ("all", "strided", "random")


class CharTokenizer:
    """One token per distinct character of ``text``, ids in sorted character
    order: ``encode(str) -> int64 array``, ``decode(ids) -> str``,
    ``vocab_size``; ``state_dict()`` / ``CharTokenizer.from_state_dict``
    (JSON-serialisable) rebuild the same vocabulary."""

    def __init__(self, text):
        self.chars = "".join(sorted(set(text)))
        if not self.chars:
            raise ValueError("CharTokenizer: the text is empty")
        self._ids = {c: i for i, c in enumerate(self.chars)}
        self._codes = np.array([ord(c) for c in self.chars], dtype=np.int64)

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, text):
        try:
            return np.fromiter((self._ids[c] for c in text), dtype=np.int64, count=len(text))
        except KeyError as e:
            raise ValueError(f"CharTokenizer.encode: character {e.args[0]!r} is not in the "
                             f"vocabulary of {self.vocab_size} characters") from None

    def decode(self, ids):
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"CharTokenizer.decode: ids must be in [0, {self.vocab_size}), "
                             f"got [{ids.min()}, {ids.max()}]")
        return "".join(map(chr, self._codes[ids]))

    def state_dict(self):
        return {"chars": self.chars}

    @classmethod
    def from_state_dict(cls, state):
        return cls(state["chars"])

    def __repr__(self):
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def unigram_entropy(tokens, vocab_size=None):
    """Entropy (nats per token) of the token frequencies of ``tokens``:
    the loss of the best model that ignores context."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64).reshape(-1), minlength=vocab_size
                         or 0)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


class TokenDataset(Dataset):
    """Next-token windows over a 1-D token array: an HDF5 file's dataset
    ``key`` (read into memory once, by each process) or an array.

    ``block_size``: tokens per input; ``windows``: "all", "strided" or
    "random" (see the module's notes; ``seed`` and ``set_epoch`` for "random")."""

    cached = True  # the tokens are in memory: the DataLoader reads inline

    def __init__(self, source, block_size, windows="all", key="tokens", seed=0):
        if int(block_size) != block_size or block_size < 1:
            raise ValueError(f"TokenDataset: block_size must be a positive integer, got "
                             f"{block_size!r}")
        if windows not in WINDOWS:
            raise ValueError(f"TokenDataset: windows must be one of {WINDOWS}, got "
                             f"{windows!r}")
        self.block_size, self.windows, self.x_key = int(block_size), windows, key
        if isinstance(source, (str, os.PathLike)):
            self.path = str(source)
            self.tokens = self._read(self.path, key)
        else:
            self.path, self.tokens = None, np.asarray(source)
        where = f"{self.path} (key {key!r})" if self.path else "the token array"
        if self.tokens.ndim != 1 or self.tokens.dtype.kind not in "iu":
            raise ValueError(f"TokenDataset: {where} must be a 1-D integer array, got "
                             f"{self.tokens.dtype} of shape {self.tokens.shape}")
        if len(self.tokens) < self.block_size + 1:
            raise ValueError(f"TokenDataset: {where} holds {len(self.tokens)} tokens, fewer "
                             f"than block_size + 1 = {self.block_size + 1} (rank "
                             f"{rank_label()})")
        self._stride = 1 if windows == "all" else self.block_size
        self._offsets = np.arange(self.block_size + 1, dtype=np.int64)
        self.seed, self.epoch, self._random_starts = int(seed), 0, None

    def set_epoch(self, epoch):
        """With ``windows="random"``: use the window starts of ``epoch``."""
        if int(epoch) != self.epoch:
            self.epoch, self._random_starts = int(epoch), None

    @staticmethod
    def _read(path, key):
        if not os.path.exists(path):
            raise FileNotFoundError(f"token file {path} does not exist (rank {rank_label()})")
        with _h5py().File(path, "r") as f:
            if key not in f:
                raise KeyError(f"token file {path} has no dataset {key!r} (it has "
                               f"{sorted(f.keys())})")
            return f[key][...]

    def __len__(self):
        return (len(self.tokens) - 1 - self.block_size) // self._stride + 1

    @property
    def sample_shape(self):
        return (self.block_size,)

    def starts(self, index):
        """The first token position of each window in ``index``."""
        index = np.asarray(index, dtype=np.int64)
        n = len(self)
        if index.size and (index.min() < -n or index.max() >= n):
            raise IndexError(f"TokenDataset: index out of range for {n} windows")
        if self.windows != "random":
            return (index % n) * self._stride
        if self._random_starts is None:  # uniform over every valid start, per epoch
            rng = np.random.Generator(np.random.PCG64([self.seed, self.epoch]))
            self._random_starts = rng.integers(0, len(self.tokens) - self.block_size, n)
        return self._random_starts[index % n]

    def __getitem__(self, index):
        """``(x, y)`` of the windows in ``index`` (an int or an index array),
        int64, shape ``index.shape + (block_size,)``."""
        windows = self.tokens[self.starts(index)[..., None] + self._offsets].astype(np.int64)
        return windows[..., :-1], windows[..., 1:]

    def __repr__(self):
        return (f"TokenDataset({self.path or 'array'}, block_size={self.block_size}, "
                f"windows={self.windows!r}, {len(self)} windows of {len(self.tokens)} "
                "tokens)")
