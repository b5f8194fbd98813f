"""PyTorch's samplers: ``Sampler``, ``SequentialSampler``, ``RandomSampler``,
``SubsetRandomSampler``, ``WeightedRandomSampler``, ``BatchSampler`` (and
``DistributedSampler``, at its PyTorch home ``distributed.py``).

The random samplers draw PyTorch's numbers: ``RandomSampler`` without a
``generator`` takes one 64-bit draw of the current stream per pass as the
seed of a fresh ``Generator``, then ``randperm(n)`` per whole pass plus one
for the remainder (drawn even when the remainder is empty), or with
``replacement`` ``randint`` in chunks of 32; with a ``generator`` it draws
from that one directly. ``SubsetRandomSampler`` is ``randperm`` of the
indices, ``WeightedRandomSampler`` ``multinomial`` of the weights.
``RandomSampler.state_dict()`` holds where the last pass's draws began (its
seed, or the given generator's state), so a DataLoader resumed mid-pass
replays that pass exactly.
"""
import numpy as np

from ... import random as sn_random
from ..._tensor import Tensor
from ...ops.sampling import multinomial
from ...random import distributions


def _check_bool(value, name, error=ValueError):
    if not isinstance(value, bool):
        raise error(f"{name} should be a boolean value, but got {name}={value!r}")


def _check_positive(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} should be a positive integer value, but got "
                         f"{name}={value!r}")


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
        self._state, self._replay = None, None

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else int(self._num_samples)

    def _pass_generator(self):
        """The generator this pass draws from, after noting where it starts."""
        if self._replay is not None:
            state, self._replay = self._replay, None
        elif self.generator is None:
            seed = int(distributions.random_full(sn_random.generator(), (), np.int64))
            state = {"seed": seed}
        else:
            sn_random.resolve(self.generator, "RandomSampler")
            state = {"generator_state": self.generator.get_state().array.tolist()}
        self._state = state
        if "seed" in state:
            return sn_random.Generator().manual_seed(state["seed"])
        # a replay into a sampler without a generator takes a fresh one in that state
        g = self.generator if self.generator is not None else sn_random.Generator()
        return g.set_state(np.asarray(state["generator_state"], np.uint8))

    def indices(self):
        """One pass's indices (an int64 array); each call draws a new pass,
        except the first after ``load_state_dict``, which replays its pass."""
        g = self._pass_generator()
        n, count = len(self.data_source), self.num_samples
        if self.replacement:
            chunks = [distributions.random_from_to(g, (32,), 0, n) for _ in range(count // 32)]
            chunks.append(distributions.random_from_to(g, (count % 32,), 0, n))
            return np.concatenate(chunks)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        perms = [distributions.randperm(g, n) for _ in range(count // n)]
        return np.concatenate(perms + [distributions.randperm(g, n)[:count % n]])

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        return self.num_samples

    def state_dict(self):
        """Where the last pass's draws began: ``{"seed": s}`` (no generator)
        or ``{"generator_state": [5056 bytes]}``; ``{"seed": None}`` before
        the first pass."""
        return dict(self._state) if self._state is not None else {"seed": None}

    def load_state_dict(self, state):
        """The next pass replays the pass of ``state`` (then new draws)."""
        if state.get("generator_state") is not None:
            self._replay = {"generator_state": list(state["generator_state"])}
        else:
            self._replay = None if state.get("seed") is None else {"seed": int(state["seed"])}


class SubsetRandomSampler(Sampler):
    """The elements of ``indices`` in a random order, a new one per pass."""

    def __init__(self, indices, generator=None):
        self.indices, self.generator = indices, generator

    def __iter__(self):
        g = sn_random.resolve(self.generator, "SubsetRandomSampler")
        order = distributions.randperm(g, len(self.indices))
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
        """``multinomial`` of the (float64) weights, PyTorch's draws."""
        return multinomial(Tensor(self.weights), self.num_samples, self.replacement,
                           generator=self.generator).numpy()

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

