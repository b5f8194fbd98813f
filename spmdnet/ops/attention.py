"""Scaled dot-product attention as one op with its own backward, and
``F.scaled_dot_product_attention``, its wrapper (which draws the dropout mask).

softmax(q kᵀ · scale + mask) v over any leading dims, PyTorch's mask rules
(a bool mask is True where attention is allowed, a float one is added,
``causal`` keeps j <= i, top-left aligned). Forward keeps q (times scale),
k, v, the output and one log-sum-exp per query row: never an (..., L, S) array.
Query rows go in blocks of ``block_rows`` (peak memory N x block x S, not
N x L x S); backward recomputes each block's probabilities from the
log-sum-exp and reads the dropout mask again. On the CPU the mask is
PyTorch's (the caller draws it from PyTorch's stream, nn/functional.py, and
passes it bit-packed as ``keep``: N x L x S bits); on a GPU it is regenerated
from the seed (``kernels.attention.dropout_keep``, a Philox counter stream).
Softmax rows use ``kernels/softmax.py``.
"""
import math

import numpy as np

from .. import kernels
from .._meta import is_meta_array
from .._tensor import Tensor
from ..autograd.function import Function
from ..autograd.meta import register_shape_rule
from ..backend import xp_of
from ..kernels.attention import dropout_keep
from ..random import distributions, generator
from ._util import unbroadcast

BLOCK_ELEMENTS = 1 << 20  # scores per block, over all leading dims


def _add(total, part):
    """total + part in place into total (a fresh product); part itself at first."""
    if total is None:
        return part
    total += part
    return total


def _check_shapes(q, k, v, mask):
    """The broadcast leading shape of q (..., L, E), k (..., S, E), v (..., S, Ev)
    and the mask (..., L, S); a RuntimeError naming every shape when they do not
    fit (rather than NumPy's gufunc message from deep inside the product)."""
    def fail(why):
        shapes = f"query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}"
        if mask is not None:
            shapes += f", attn_mask {tuple(mask.shape)}"
        raise RuntimeError(f"scaled_dot_product_attention: {why} ({shapes})")

    if min(q.ndim, k.ndim, v.ndim) < 2:
        fail("query, key and value need at least 2 dimensions")
    if q.shape[-1] != k.shape[-1]:
        fail(f"query's embedding size {q.shape[-1]} differs from key's {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        fail(f"key's sequence length {k.shape[-2]} differs from value's {v.shape[-2]}")
    try:
        return np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2],
                                   () if mask is None else mask.shape[:-2])
    except ValueError:
        fail("the batch dimensions do not broadcast")


class ScaledDotProductAttention(Function):
    """Inputs q, k, v and optionally a mask that may need a gradient (a
    float one); a mask that needs none may come as ``mask=``."""

    def forward(self, q, k, v, *grad_mask, mask=None, causal=False, scale=1.0, dropout_p=0.0,
                seed=0, keep=None, block_rows=None):
        mask = grad_mask[0] if grad_mask else mask
        xp = xp_of(q, k, v)
        lead = _check_shapes(q, k, v, mask)
        length, source = q.shape[-2], k.shape[-2]
        self.shapes, self.lead = (q.shape, k.shape, v.shape), lead
        self.q, self.k, self.v = (xp.broadcast_to(a, lead + a.shape[-2:]).reshape(
            (math.prod(lead),) + a.shape[-2:]) for a in (q, k, v))  # -1: ambiguous when empty
        if mask is not None:
            mask = mask if mask.dtype.kind == "b" else mask.astype(q.dtype, copy=False)
        self.mask, self.causal, self.scale = mask, causal, scale
        n = self.q.shape[0]
        if keep is not None:  # drawn over q kᵀ's leading dims: shared across value's extra ones
            keep = np.broadcast_to(keep, lead + keep.shape[-2:]).reshape((n,) + keep.shape[-2:])
        self.dropout_p, self.seed, self.keep = dropout_p, seed, keep
        self.block = block_rows or max(1, BLOCK_ELEMENTS // max(1, n * source))
        # keep q * scale in place of q: scores need no scaling
        # pass (L x S) in forward or backward, and dk = ds^T (q * scale)
        self.q = self.q * q.dtype.type(scale)
        self.out = xp.empty((n, length, v.shape[-1]), q.dtype)
        self.lse = xp.empty((n, length), q.dtype)
        softmax_lse = kernels.lookup("softmax", self.q, step="forward_lse")
        for rows in self._blocks():
            s = self._scores(xp, rows)
            if softmax_lse is not None:  # one pass per row, no temporaries
                p, self.lse[:, rows.start:rows.stop] = softmax_lse(s)
            else:
                m = s.max(axis=-1, keepdims=True)
                p = xp.exp(s - m)
                total = p.sum(axis=-1, keepdims=True)
                self.lse[:, rows.start:rows.stop] = (m + xp.log(total))[..., 0]
                p /= total
            if dropout_p > 0:
                p *= self._dropout(xp, rows)
            xp.matmul(p, self.v, out=self.out[:, rows.start:rows.stop])
        return self.out.reshape(lead + self.out.shape[1:])

    def backward(self, grad):
        xp = xp_of(grad)
        g = xp.ascontiguousarray(grad.reshape(self.out.shape))
        dsum = (g * self.out).sum(axis=-1)
        dq, dk, dv = xp.empty_like(self.q), None, None  # dk, dv: sums over the blocks
        has_mask = len(self.needs_input_grad) > 3  # a mask tensor among the inputs
        want_mask = has_mask and self.needs_input_grad[3] and self.mask.dtype.kind != "b"
        dmask = xp.zeros(self.mask.shape, self.mask.dtype) if want_mask else None
        from_lse = kernels.lookup("softmax", self.q, step="from_lse")
        for rows in self._blocks():
            r = slice(rows.start, rows.stop)
            s = self._scores(xp, rows)
            p = from_lse(s, self.lse[:, r]) if from_lse else xp.exp(s - self.lse[:, r, None])
            dp = xp.matmul(g[:, r], self.v.transpose(0, 2, 1))
            kept = p
            if self.dropout_p > 0:
                z = self._dropout(xp, rows)
                kept, dp = p * z, dp * z
            dv = _add(dv, xp.matmul(kept.transpose(0, 2, 1), g[:, r]))
            ds = p * (dp - dsum[:, r, None])
            if dmask is not None:
                self._mask_grad(dmask, ds, r)
            xp.matmul(ds, self.k, out=dq[:, r])
            dq[:, r] *= self.q.dtype.type(self.scale)
            dk = _add(dk, xp.matmul(ds.transpose(0, 2, 1), self.q[:, r]))
        if dk is None:  # no query rows (L = 0): nothing reached k or v
            dk, dv = xp.zeros_like(self.k), xp.zeros_like(self.v)
        return self._unbroadcast(dq, dk, dv) + ((dmask,) if has_mask else ())

    def _blocks(self):
        length = self.q.shape[1]
        return [range(r, min(r + self.block, length)) for r in range(0, length, self.block)]

    def _scores(self, xp, rows):
        """Scores of query rows ``rows`` (N, rows, S), masked."""
        r = slice(rows.start, rows.stop)
        s = xp.matmul(self.q[:, r], self.k.transpose(0, 2, 1))  # q is scaled already
        source = s.shape[-1]
        if self.causal:
            future = xp.arange(source)[None, :] > xp.arange(rows.start, rows.stop)[:, None]
            xp.copyto(s, -xp.inf, where=future)  # s is this block's own fresh array
        if self.mask is not None:
            m = self.mask[..., r, :] if self.mask.ndim >= 2 and self.mask.shape[-2] > 1 \
                else self.mask
            m = xp.broadcast_to(m, self.lead + (len(rows), source)).reshape(s.shape)
            s = xp.where(m, s, -xp.inf) if m.dtype.kind == "b" else s + m
        return s

    def _dropout(self, xp, rows):
        """The kept-and-scaled factors of rows ``rows``: unpacked from ``keep``,
        or regenerated from the seed."""
        shape = self.q.shape[:2] + self.k.shape[1:2]
        if self.keep is not None:
            bits = np.unpackbits(self.keep[:, rows.start:rows.stop], axis=-1, count=shape[2])
            # PyTorch's noise.div_(1 - p), the divisor rounded to the dtype first: each
            # kept factor is exactly 1 / divisor in the dtype, so one multiply pass
            one = self.q.dtype.type(1.0)
            return np.multiply(bits, one / self.q.dtype.type(1.0 - self.dropout_p),
                               dtype=self.q.dtype)
        if self.dropout_p >= 1:  # PyTorch: all dropped, nothing drawn
            return xp.zeros((shape[0], len(rows), shape[2]), self.q.dtype)
        keep = dropout_keep(xp, shape, rows, self.seed, self.dropout_p)
        return keep * self.q.dtype.type(1.0 / (1.0 - self.dropout_p))

    def _mask_grad(self, dmask, ds, r):
        """Add the scores' gradient of rows r to the mask's, unbroadcast."""
        full = ds.reshape(self.lead + ds.shape[1:])
        if dmask.ndim >= 2 and dmask.shape[-2] > 1:
            dmask[..., r, :] += unbroadcast(full, dmask.shape[:-2] + (ds.shape[1], dmask.shape[-1]))
        else:
            dmask += unbroadcast(full, dmask.shape)

    def _unbroadcast(self, *grads):
        need = self.needs_input_grad
        return tuple(unbroadcast(g.reshape(self.lead + g.shape[1:]), shape) if need[i] else None
                     for i, (g, shape) in enumerate(zip(grads, self.shapes, strict=True)))


def _meta_shape(q, k, v, *grad_mask, mask=None, **_):
    """The op's result on meta inputs: (..., L, Ev), no blocks computed."""
    mask = grad_mask[0] if grad_mask else mask
    return _check_shapes(q, k, v, mask) + (q.shape[-2], v.shape[-1]), q.dtype


register_shape_rule(ScaledDotProductAttention, _meta_shape)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None):
    """softmax(query @ keyᵀ · scale + mask) @ value over (..., L, E), (..., S, E)
    and (..., S, Ev), one op (below). A bool ``attn_mask`` is
    True where attention is allowed; a float one is added to the scores;
    ``is_causal`` allows the lower triangle of (L, S); ``scale`` defaults to
    1/sqrt(E). ``dropout_p`` drops attention weights whenever it is > 0 (pass 0.0 in evaluation)."""
    if is_causal and attn_mask is not None:
        raise RuntimeError("scaled_dot_product_attention: give attn_mask or is_causal, "
                           "not both")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be between 0 and 1, "
                         f"got {dropout_p}")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    inputs, mask = (query, key, value), None
    if isinstance(attn_mask, Tensor):
        inputs += (attn_mask,)
    elif attn_mask is not None:
        mask = xp_of(query.array).asarray(attn_mask)
    seed, keep = 0, None
    if any(is_meta_array(t.array) for t in (query, key, value)):
        dropout_p = 0.0  # shape-only: PyTorch's meta attention draws nothing
    elif 0.0 < dropout_p < 1.0 and xp_of(query.array) is np:
        keep = _attention_keep(query, key, attn_mask, 1.0 - dropout_p)
    elif dropout_p > 0:  # a GPU's Philox stream, seeded by one 64-bit draw (p = 1 draws none)
        seed = int(generator().random64(1)[0]) >> 1 if dropout_p < 1 else 0
    return ScaledDotProductAttention.apply(*inputs, mask=mask, causal=bool(is_causal),
                                           scale=float(scale), dropout_p=float(dropout_p),
                                           seed=seed, keep=keep)


def _attention_keep(query, key, attn_mask, keep_p):
    """The kept attention weights, as PyTorch's CPU (math) attention draws
    them: ``bernoulli_(1 - p)`` over the weights (..., L, S) after the softmax,
    one float64 uniform each in row-major order, from the current generator;
    bit-packed along S (``np.packbits``), drawn a slab of rows at a time.
    The weights' leading dims are those of q, k and the mask: a value that
    broadcasts further shares each mask across its extra dims (the op
    broadcasts it), as PyTorch's weights @ value does."""
    shapes = [t.shape[:-2] for t in (query, key)]
    if attn_mask is not None:
        shapes.append(tuple(getattr(attn_mask, "shape", np.shape(attn_mask)))[:-2])
    try:
        lead = np.broadcast_shapes(*shapes)
    except ValueError:
        return None  # the op names the shapes that do not fit
    rows, source = math.prod(lead) * query.shape[-2], key.shape[-2]
    packed = np.empty((rows, (source + 7) // 8), np.uint8)
    step = max(1, (1 << 20) // max(1, source))
    for r in range(0, rows, step):
        n = min(step, rows - r)
        draws = distributions.bernoulli_scalar(generator(), (n, source), keep_p, np.bool_)
        packed[r:r + n] = np.packbits(draws, axis=-1)
    return packed.reshape(lead + (query.shape[-2], (source + 7) // 8))
