"""PyTorch's samplers: ``Sampler``, ``SequentialSampler``, ``RandomSampler``,
``SubsetRandomSampler``, ``WeightedRandomSampler``, ``BatchSampler`` (and
``DistributedSampler``, at its PyTorch home ``distributed.py``).

Random samplers draw a fresh 63-bit seed per pass from ``generator`` (a
``numpy.random.Generator``; None: spmdnet's global generator) and draw the
pass from ``numpy.random.Generator(PCG64(seed))``: the same properties as
PyTorch's (a permutation per pass, uniform or weighted draws), not PyTorch's
exact numbers. ``RandomSampler.state_dict()`` holds the seed of the last
pass, so a DataLoader resumed mid-pass replays that pass exactly.
"""
import numpy as np

from .dataset import rng_of


def _check_bool(value, name, error=ValueError):
    if not isinstance(value, bool):
        raise error(f"{name} should be a boolean value, but got {name}={value!r}")


def _check_positive(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} should be a positive integer value, but got "
                         f"{name}={value!r}")


def _pass_rng(generator):
    seed = int(rng_of(generator).integers(2**63))
    return seed, np.random.Generator(np.random.PCG64(seed))


class Sampler:
    """Iterates indices of a dataset (subclasses define ``__iter__``)."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} is a Sampler without __iter__")


class SequentialSampler(Sampler):
    """``0, 1, ..., len(data_source) - 1``."""

    def __init__(self, data_source):
        self.data_source = data_source

    def indices(self):
        return np.arange(len(self.data_source), dtype=np.int64)

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    """A random order of ``data_source``: a permutation per pass (with more
    ``num_samples`` than samples: whole permutations, then part of one), or
    ``num_samples`` uniform draws with ``replacement``."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        _check_bool(replacement, "replacement", TypeError)
        self.data_source, self.replacement, self.generator = data_source, replacement, generator
        self._num_samples = num_samples
        if num_samples is not None:
            _check_positive(num_samples, "num_samples")
        self._seed, self._replay = None, None

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else int(self._num_samples)

    def indices(self):
        """One pass's indices (an int64 array); each call draws a new pass,
        except the first after ``load_state_dict``, which replays its pass."""
        if self._replay is not None:
            self._seed, self._replay = self._replay, None
            rng = np.random.Generator(np.random.PCG64(self._seed))
        else:
            self._seed, rng = _pass_rng(self.generator)
        n, count = len(self.data_source), self.num_samples
        if self.replacement:
            return rng.integers(0, n, count, dtype=np.int64)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        perms = [rng.permutation(n) for _ in range(count // n)]
        return np.concatenate(perms + [rng.permutation(n)[:count % n]]).astype(np.int64)

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        return self.num_samples

    def state_dict(self):
        """The seed of the last pass drawn (None before the first)."""
        return {"seed": self._seed}

    def load_state_dict(self, state):
        """The next pass replays the pass of ``state`` (then new draws)."""
        self._replay = None if state.get("seed") is None else int(state["seed"])


class SubsetRandomSampler(Sampler):
    """The elements of ``indices`` in a random order, a new one per pass."""

    def __init__(self, indices, generator=None):
        self.indices, self.generator = indices, generator

    def __iter__(self):
        order = _pass_rng(self.generator)[1].permutation(len(self.indices))
        return iter([self.indices[i] for i in order.tolist()])

    def __len__(self):
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """``num_samples`` indices drawn with probabilities proportional to
    ``weights`` (non-negative, not all zero); without ``replacement`` each
    index at most once."""

    def __init__(self, weights, num_samples, replacement=True, generator=None):
        _check_positive(num_samples, "num_samples")
        _check_bool(replacement, "replacement")
        weights = np.asarray(getattr(weights, "array", weights), dtype=np.float64)
        if weights.ndim != 1:
            raise ValueError(f"weights should be a 1-d sequence, but got a "
                             f"{weights.ndim}-d one of shape {weights.shape}")
        if (weights < 0).any() or not np.isfinite(weights).all() or weights.sum() <= 0:
            raise ValueError(f"weights must be finite, non-negative and not all zero, got "
                             f"min {weights.min() if weights.size else None}, sum "
                             f"{weights.sum()}")
        if not replacement and num_samples > np.count_nonzero(weights):
            raise ValueError(f"cannot draw {num_samples} samples without replacement from "
                             f"{np.count_nonzero(weights)} non-zero weights")
        self.weights, self.num_samples = weights, int(num_samples)
        self.replacement, self.generator = replacement, generator

    def indices(self):
        rng = _pass_rng(self.generator)[1]
        p = self.weights / self.weights.sum()
        return rng.choice(len(p), self.num_samples, replace=self.replacement,
                          p=p).astype(np.int64)

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        return self.num_samples


class BatchSampler(Sampler):
    """Lists of ``batch_size`` consecutive indices of ``sampler``; the last
    one shorter unless ``drop_last``."""

    def __init__(self, sampler, batch_size, drop_last):
        _check_positive(batch_size, "batch_size")
        _check_bool(drop_last, "drop_last")
        self.sampler, self.batch_size, self.drop_last = sampler, int(batch_size), drop_last

    def __iter__(self):
        batch = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return -(-len(self.sampler) // self.batch_size)

