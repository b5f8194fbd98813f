"""``multinomial``: category indices drawn from rows of non-negative weights
(every GPT ``generate`` samples its next token with it), PyTorch's
signature and errors. Draws come from spmdnet's generator on the host, as
``nn.init`` and ``normal_`` draw (the same seed gives the same indices on
CPU and GPU); the indices go to the input's device.

With replacement each draw inverts the row's cumulative distribution.
Without, the draws are sequential sampling without replacement, computed at
once: the ``num_samples`` largest p_i / E_i for E_i ~ Exp(1) (an exponential
race: the smallest E_i / p_i arrives first with probability p_i / sum p,
then the next among the rest). Zero-weight categories come last, in index
order, as PyTorch's.
"""
import numpy as np

from .._tensor import Tensor
from ..backend import asnumpy, to_device, device_of
from ..random import generator as default_generator


def _checked_rows(input, num_samples, replacement):  # noqa: A002 - PyTorch's name
    """The input's weights as a float64 host array of rows, after PyTorch's checks."""
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
    rows = asnumpy(input.array).reshape(-1, categories).astype(np.float64)
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
    input's device. ``generator``: a ``numpy.random.Generator`` (spmdnet's by
    default)."""
    num_samples = int(num_samples)
    rows = _checked_rows(input, num_samples, replacement)
    rng = default_generator() if generator is None else generator
    if replacement:
        cdf = np.cumsum(rows, axis=1)
        cdf /= cdf[:, -1:]
        u = rng.random((rows.shape[0], num_samples))
        # the first category whose cumulative weight exceeds u (never a zero-weight one)
        out = np.stack([np.searchsorted(c, x, side="right") for c, x in zip(cdf, u)])
        out = np.minimum(out, rows.shape[1] - 1)
    else:
        keys = rows / rng.standard_exponential(rows.shape)
        out = np.argsort(-keys, axis=1, kind="stable")[:, :num_samples]
    out = out.astype(np.int64).reshape(input.shape[:-1] + (num_samples,))
    return Tensor(to_device(out, device_of(input.array)))
