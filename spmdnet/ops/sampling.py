"""Sampling with PyTorch's CPU streams (``spmdnet.random``): ``multinomial``,
``bernoulli``, ``normal`` (its four overloads) and the in-place fills
``normal_``, ``uniform_``, ``bernoulli_``, ``exponential_``, ``random_``,
``geometric_``, ``log_normal_``, ``cauchy_``. Every draw is made on the host
from the current ``Generator`` (or ``generator=``), exactly as PyTorch draws
after the same seed; a tensor on a GPU receives the host values.

``multinomial`` follows PyTorch's two algorithms: with replacement (and more
than one sample) each draw inverts the row's cumulative distribution (summed
and normalised in the input's dtype) with a float64 uniform; without
replacement, or for one sample, the largest ``p / q`` with ``q`` exponential
(in the input's dtype), ties in index order.
"""
import numpy as np

from .. import random as sn_random
from .._device import is_meta_array
from .._tensor import Tensor
from ..backend import asnumpy, device_of, to_device, xp_of
from ..creation import empty
from ..random import distributions
from .inplace import _no_graph


def _checked_rows(input, num_samples, replacement):  # noqa: A002 - PyTorch's name
    """The input's weights as a host array of rows, after PyTorch's checks."""
    if not isinstance(input, Tensor):
        raise TypeError(f"multinomial(): input must be a Tensor, got {type(input).__name__}")
    if input.ndim not in (1, 2):
        raise RuntimeError(f"prob_dist must be 1 or 2 dim (got shape {input.shape})")
    if input.dtype.kind != "f":
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, "
                           f"got: {input.dtype}")
    if num_samples <= 0:
        raise RuntimeError(f"cannot sample n_sample <= 0 samples (got {num_samples})")
    categories = input.shape[-1]
    if not replacement and num_samples > categories:
        raise RuntimeError(f"cannot sample n_sample > prob_dist.size(-1) samples without "
                           f"replacement ({num_samples} > {categories})")
    rows = asnumpy(input.array).reshape(-1, categories)
    if rows.dtype not in (np.float32, np.float64):
        rows = rows.astype(np.float32)
    if rows.size == 0:
        raise RuntimeError(f"multinomial(): cannot sample from an empty distribution "
                           f"(shape {input.shape})")
    if not np.all(np.isfinite(rows)) or np.any(rows < 0):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if np.any(rows.sum(axis=1) <= 0):
        bad = np.flatnonzero(rows.sum(axis=1) <= 0).tolist()
        raise RuntimeError(f"invalid multinomial distribution (sum of probabilities <= 0; "
                           f"rows {bad})")
    return rows


def multinomial(input, num_samples, replacement=False, *, generator=None):  # noqa: A002
    """``num_samples`` category indices per row of ``input`` (1-D: one
    distribution, 2-D: one per row; weights need not sum to 1), int64 on the
    input's device."""
    num_samples = int(num_samples)
    rows = _checked_rows(input, num_samples, replacement)
    g = sn_random.resolve(generator, "multinomial")
    if replacement and num_samples > 1:
        cdf = np.cumsum(rows, axis=1)
        cdf /= cdf[:, -1:]
        out = np.stack([np.searchsorted(c.astype(np.float64), g.uniform01(num_samples,
                                                                          np.float64))
                        for c in cdf])
    else:
        keys = rows / distributions.exponential(g, rows.shape, 1.0, rows.dtype)
        out = np.argsort(-keys, axis=1, kind="stable")[:, :num_samples]
    out = out.astype(np.int64).reshape(input.shape[:-1] + (num_samples,))
    return Tensor(to_device(out, device_of(input.array)))


def bernoulli(input, p=None, *, generator=None):  # noqa: A002 - PyTorch's name
    """0/1 draws: ``torch.bernoulli(input)`` takes each element of ``input``
    as its probability; ``bernoulli(input, p)`` one probability ``p`` for
    all (input's shape and dtype)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"bernoulli(): input must be a Tensor, got {type(input).__name__}")
    g = sn_random.resolve(generator, "bernoulli")
    if p is None:
        probs = asnumpy(input.array)
        if np.any((probs < 0) | (probs > 1)) or not np.all(np.isfinite(probs)):
            raise RuntimeError("bernoulli(): every probability must be in [0, 1], got "
                               f"values from {probs.min()} to {probs.max()}")
        out = distributions.bernoulli_tensor(g, probs, input.dtype)
    else:
        out = distributions.bernoulli_scalar(g, input.shape, _probability(p), input.dtype)
    return Tensor(to_device(out, device_of(input.array)))


def _probability(p):
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    return p


def normal(mean, std=1.0, size=None, *, generator=None, dtype=None, device=None,
           requires_grad=False, out=None):
    """``torch.normal``: (Tensor, Tensor), (Tensor, float), (float, Tensor)
    broadcast mean and std; (float, float, size) fills a new tensor. Drawn and
    rounded as PyTorch: normals over the result's shape, times a std tensor,
    plus the mean, each step rounded in the result's dtype."""
    if out is not None:
        raise TypeError("normal(): out= is not supported; assign the result instead")
    g = sn_random.resolve(generator, "normal")
    if not isinstance(mean, Tensor) and not isinstance(std, Tensor):
        if size is None:
            raise TypeError("normal(): with a float mean and std, give size")
        t = empty(size, dtype=dtype, device=device)
        return normal_(t, mean, std, generator=g).requires_grad_(requires_grad)
    tensors = [x for x in (mean, std) if isinstance(x, Tensor)]
    m, s = (asnumpy(x.array) if isinstance(x, Tensor) else x for x in (mean, std))
    result_dtype = tensors[0].dtype
    if np.any(np.asarray(s) < 0):
        raise RuntimeError(f"normal expects all elements of std >= 0.0, got min "
                           f"{np.min(s)}")
    shape = np.broadcast_shapes(np.shape(m), np.shape(s))
    kind = result_dtype.type
    if isinstance(std, Tensor):  # PyTorch: normal_(0, 1), then mul_(std), then add_(mean)
        values = distributions.normal(g, shape, 0.0, 1.0, result_dtype) * s.astype(kind)
    else:  # normal_(0, std), then add_(mean)
        values = distributions.normal(g, shape, 0.0, float(std), result_dtype)
    values = (values + np.asarray(m).astype(kind)).astype(result_dtype, copy=False)
    return Tensor(to_device(values, device_of(tensors[0].array)))


# -- in-place fills (Tensor methods) ----------------------------------------
def _fill(self, name, values):
    """Write host ``values`` into ``self`` (on its device), PyTorch's in-place
    semantics: a tensor in an autograd graph refuses."""
    _no_graph(self, name)
    self.array[...] = xp_of(self.array).asarray(values).astype(self.dtype, copy=False)
    return self


def _draw_into(self, name, generator, draw):
    """Fill ``self`` with ``draw(g)``, ``g`` the generator that ``generator``
    names; a meta tensor draws nothing, as PyTorch's meta kernels."""
    if is_meta_array(self.array):
        return self
    return _fill(self, name, draw(sn_random.resolve(generator, name)))


def _floating(self, name):
    if self.dtype.kind not in "fc":
        raise RuntimeError(f"{name} expects a floating-point tensor, got {self.dtype}")


def normal_(self, mean=0.0, std=1.0, *, generator=None):
    """Fill with N(mean, std²), PyTorch's draws."""
    _floating(self, "normal_")
    if float(std) < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    if self.dtype.kind != "c":
        return _draw_into(self, "normal_", generator, lambda g: distributions.normal(
            g, self.shape, mean, std, self.dtype))
    part = np.float32 if self.dtype == np.complex64 else np.float64
    return _draw_into(self, "normal_", generator, lambda g: distributions.normal(
        g, self.shape + (2,), mean, float(std) / np.sqrt(2), part
    ).view(self.dtype).reshape(self.shape))


def uniform_(self, *bounds, generator=None, **names):
    """Fill with U(from, to) (defaults 0 and 1; PyTorch's argument names
    ``from``/``to`` as keywords), PyTorch's draws."""
    lo, hi = (list(bounds) + [names.pop("from", 0.0), names.pop("to", 1.0)][len(bounds):])[:2]
    if names:
        raise TypeError(f"uniform_() got unexpected keyword arguments {sorted(names)}")
    _floating(self, "uniform_")
    if float(lo) > float(hi):
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found "
                           f"from={lo} > to={hi}")
    return _draw_into(self, "uniform_", generator,
                      lambda g: distributions.uniform(g, self.shape, lo, hi, self.dtype))


def bernoulli_(self, p=0.5, *, generator=None):
    """Fill with 0/1 draws: probability ``p`` (a number, or a tensor
    broadcast to this shape)."""
    if isinstance(p, Tensor):
        return _draw_into(self, "bernoulli_", generator, lambda g: distributions.bernoulli_tensor(
            g, np.broadcast_to(asnumpy(p.array), self.shape), self.dtype))
    return _draw_into(self, "bernoulli_", generator, lambda g: distributions.bernoulli_scalar(
        g, self.shape, _probability(p), self.dtype))


def exponential_(self, lambd=1.0, *, generator=None):
    _floating(self, "exponential_")
    if not float(lambd) > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    return _draw_into(self, "exponential_", generator,
                      lambda g: distributions.exponential(g, self.shape, lambd, self.dtype))


def geometric_(self, p, *, generator=None):
    if not 0 < float(p) < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    return _draw_into(self, "geometric_", generator,
                      lambda g: distributions.geometric(g, self.shape, p, self.dtype))


def log_normal_(self, mean=1.0, std=2.0, *, generator=None):
    _floating(self, "log_normal_")
    if not float(std) > 0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std}")
    return _draw_into(self, "log_normal_", generator,
                      lambda g: distributions.log_normal(g, self.shape, mean, std, self.dtype))


def cauchy_(self, median=0.0, sigma=1.0, *, generator=None):
    _floating(self, "cauchy_")
    return _draw_into(self, "cauchy_", generator,
                      lambda g: distributions.cauchy(g, self.shape, median, sigma, self.dtype))


def random_(self, *bounds, generator=None, **names):
    """``random_()`` (the dtype's exact integers), ``random_(to)`` or
    ``random_(from, to)``."""
    lo, hi = names.pop("from", None), names.pop("to", None)
    if names:
        raise TypeError(f"random_() got unexpected keyword arguments {sorted(names)}")
    bounds = list(bounds)
    if len(bounds) == 2:
        lo, hi = bounds
    elif len(bounds) == 1:
        lo, hi = (0, bounds[0]) if lo is None else (lo, bounds[0])
    def draw(g):
        if hi is None:
            return distributions.random_full(g, self.shape, self.dtype)
        first = 0 if lo is None else int(lo)
        if first >= int(hi):
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got "
                               f"from={first} >= to={hi}")
        return distributions.random_from_to(g, self.shape, first, int(hi))

    return _draw_into(self, "random_", generator, draw)


METHODS = {"normal_": normal_, "uniform_": uniform_, "bernoulli_": bernoulli_,
           "bernoulli": bernoulli, "exponential_": exponential_, "geometric_": geometric_,
           "log_normal_": log_normal_, "cauchy_": cauchy_, "random_": random_,
           "multinomial": multinomial}
