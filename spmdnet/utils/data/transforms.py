"""Batch transforms for image batches ``(N, C, H, W)``: random crop with
padding, horizontal flip, per-channel normalisation, and ``Compose``.

A transform is called as ``transform(x, rng)`` on a whole batch (NumPy or
CuPy, through ``xp_of``) with a ``numpy.random.Generator``; the random draws
(one small host array per batch) are made with ``rng`` and the work is done
by the batch's array module. The DataLoader (``transform=``) seeds ``rng``
per batch from ``batch_seed``: the sampler's seed, its epoch, the rank and
the batch's position in the rank's epoch, so a run is reproducible, ranks
draw different crops, and a resumed loader yields the same augmented batches
as an uninterrupted one.
"""
import numpy as np

from ...backend import xp_of


def batch_seed(seed, epoch, rank, position):
    """The generator of the batch starting at sample ``position`` of this
    rank's epoch."""
    return np.random.default_rng([int(seed), int(epoch), int(rank), int(position)])


def _check_images(x, who):
    if x.ndim != 4:
        raise ValueError(f"{who} takes image batches (N, C, H, W), got shape {x.shape}")


class RandomCrop:
    """Pad each image by ``padding`` (zeros) on every side, then cut a
    ``size`` (int or (h, w)) window at a random place, per sample."""

    def __init__(self, size, padding=0):
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.padding = int(padding)
        if self.padding < 0 or min(self.size) < 1:
            raise ValueError(f"RandomCrop needs size >= 1 and padding >= 0, got size "
                             f"{self.size} and padding {self.padding}")

    def __call__(self, x, rng):
        _check_images(x, "RandomCrop")
        xp, p, (h, w) = xp_of(x), self.padding, self.size
        n, c, hp, wp = x.shape[0], x.shape[1], x.shape[2] + 2 * p, x.shape[3] + 2 * p
        if h > hp or w > wp:
            raise ValueError(f"RandomCrop of size {self.size} is larger than the padded "
                             f"images ({hp}, {wp})")
        padded = xp.pad(x, ((0, 0), (0, 0), (p, p), (p, p))) if p else x
        top, left = rng.integers(0, hp - h + 1, n), rng.integers(0, wp - w + 1, n)
        rows = xp.asarray(top[:, None] + np.arange(h))[:, None, :, None]
        cols = xp.asarray(left[:, None] + np.arange(w))[:, None, None, :]
        return padded[xp.arange(n)[:, None, None, None], xp.arange(c)[None, :, None, None],
                      rows, cols]

    def __repr__(self):
        return f"RandomCrop({self.size}, padding={self.padding})"


class RandomHorizontalFlip:
    """Mirror each image left-right with probability ``p``."""

    def __init__(self, p=0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip needs 0 <= p <= 1, got {p}")
        self.p = float(p)

    def __call__(self, x, rng):
        _check_images(x, "RandomHorizontalFlip")
        xp = xp_of(x)
        flip = xp.asarray(rng.random(x.shape[0]) < self.p)[:, None, None, None]
        return xp.where(flip, x[..., ::-1], x)

    def __repr__(self):
        return f"RandomHorizontalFlip(p={self.p})"


class Normalize:
    """``(x - mean[c]) / std[c]`` per channel, in the batch's dtype."""

    def __init__(self, mean, std):
        self.mean, self.std = np.atleast_1d(mean), np.atleast_1d(std)
        if self.mean.shape != self.std.shape or (self.std <= 0).any():
            raise ValueError(f"Normalize needs one positive std per mean, got mean "
                             f"{self.mean.tolist()} and std {self.std.tolist()}")

    def __call__(self, x, rng=None):
        _check_images(x, "Normalize")
        if len(self.mean) not in (1, x.shape[1]):
            raise ValueError(f"Normalize has {len(self.mean)} channel means but the batch "
                             f"has {x.shape[1]} channels")
        xp = xp_of(x)
        mean = xp.asarray(self.mean, dtype=x.dtype)[:, None, None]
        std = xp.asarray(self.std, dtype=x.dtype)[:, None, None]
        return (x - mean) / std

    def __repr__(self):
        return f"Normalize(mean={self.mean.tolist()}, std={self.std.tolist()})"


class Compose:
    """Apply ``transforms`` in order, all drawing from the same generator."""

    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, x, rng):
        for t in self.transforms:
            x = t(x, rng)
        return x

    def __repr__(self):
        return f"Compose({self.transforms!r})"
