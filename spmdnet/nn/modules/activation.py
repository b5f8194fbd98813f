"""Activation modules (PyTorch's ``torch.nn.modules.activation``): PyTorch's
classes and arguments over the ``F.*`` functions, and ``nn.MultiheadAttention``
with PyTorch's parameters, state_dict keys, init and masks.

``inplace=True`` is accepted for PyTorch's signatures; the result is the
same values, computed out of place (docs/PYTORCH.md).
"""
import math

from ..._tensor import Tensor
from ...backend import xp_of
from .. import functional as F
from .. import init
from ..parameter import Parameter
from .linear import Linear
from .module import Module
from .utils import _empty, _move


class ReLU(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x):
        return F.relu(x)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class Hardtanh(Module):
    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False):
        super().__init__()
        if min_val > max_val:
            raise ValueError(f"Hardtanh: min_val ({min_val}) cannot be greater than max_val "
                             f"({max_val})")
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, x):
        return F.hardtanh(x, self.min_val, self.max_val)

    def extra_repr(self):
        inplace = ", inplace=True" if self.inplace else ""
        return f"min_val={self.min_val}, max_val={self.max_val}{inplace}"


class ReLU6(Hardtanh):
    """Hardtanh on [0, 6] (MobileNet's activation)."""

    def __init__(self, inplace=False):
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class Sigmoid(Module):
    def forward(self, x):
        return F.sigmoid(x)


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    """x * sigmoid(x)."""

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x):
        return F.silu(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}"


class ELU(Module):
    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, x):
        return F.elu(x, self.alpha)

    def extra_repr(self):
        return f"alpha={self.alpha}"


class Softplus(Module):
    """log(1 + exp(beta * x)) / beta, linear above ``threshold``."""

    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return F.softplus(x, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class Softmax(Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim, _stacklevel=5)  # dim=None: PyTorch's implicit rule

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.log_softmax(x, self.dim, _stacklevel=5)

    def extra_repr(self):
        return f"dim={self.dim}"


class MultiheadAttention(Module):
    """``torch.nn.MultiheadAttention``: ``in_proj_weight`` (3E, E) holds the
    q, k and v projections (rows in that order), ``in_proj_bias`` (3E,),
    ``out_proj`` a Linear(E, E). Init: xavier_uniform_ in_proj, zero biases
    (out_proj's weight keeps Linear's init). Masks: True (or -inf) = masked
    out; float masks are added. ``kdim``/``vdim`` other than ``embed_dim``,
    ``add_bias_kv`` and ``add_zero_attn`` are not provided."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be positive "
                             f"and divisible by num_heads ({num_heads})")
        if add_bias_kv or add_zero_attn or kdim not in (None, embed_dim) \
                or vdim not in (None, embed_dim):
            raise NotImplementedError("MultiheadAttention: add_bias_kv, add_zero_attn and "
                                      "kdim/vdim other than embed_dim are not provided")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.dropout, self.batch_first = dropout, batch_first
        self.in_proj_weight = Parameter(_empty((3 * embed_dim, embed_dim), dtype, device))
        self.in_proj_bias = Parameter(_empty((3 * embed_dim,), dtype, device)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        self._reset_parameters()
        _move(self, device)

    def _reset_parameters(self):
        init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        """``(output, weights)``: output like ``query``; weights (N, L, S) averaged
        over heads (or (N, H, L, S)) when ``need_weights``, else None."""
        if is_causal and attn_mask is None:
            raise RuntimeError("MultiheadAttention: is_causal is a hint and needs attn_mask "
                               "(as PyTorch)")
        batched = query.ndim == 3
        q, k, v = (self._batch_major(t, batched) for t in (query, key, value))
        n, length, e = q.shape
        source = k.shape[1]
        q, k, v = self._project(q, k, v)
        q, k, v = (t.reshape(n, -1, self.num_heads, self.head_dim).transpose(1, 2)
                   for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        mask = self._mask(q, attn_mask, key_padding_mask, n, length, source)
        weights = None
        if need_weights:  # the weights are returned: the explicit composition, as PyTorch
            scores = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            weights = F.softmax(scores if mask is None else scores + Tensor(mask), dim=-1)
            if p > 0:
                weights = F.dropout(weights, p)
            out = weights.matmul(v)
        elif is_causal and key_padding_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        out = self.out_proj(out.transpose(1, 2).reshape(n, length, e))
        out = out.transpose(0, 1) if batched and not self.batch_first else out
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        if not batched:
            out = out.reshape(length, e)
            weights = None if weights is None else weights.squeeze(0)
        return out, weights

    def _batch_major(self, t, batched):
        if not batched:
            return t.unsqueeze(0)
        return t if self.batch_first else t.transpose(0, 1)

    def _project(self, q, k, v):
        w, b, e = self.in_proj_weight, self.in_proj_bias, self.embed_dim
        if q is k and k is v:
            return F.linear(q, w, b).chunk(3, dim=-1)
        return tuple(F.linear(t, w[i * e:(i + 1) * e], None if b is None else b[i * e:(i + 1) * e])
                     for i, t in enumerate((q, k, v)))

    def _mask(self, q, attn_mask, key_padding_mask, n, length, source):
        """One additive float mask broadcasting to (N, H, L, S), or None."""
        mask = None
        if attn_mask is not None:
            mask = _additive(attn_mask, q)
            if mask.ndim == 3:  # (N * H, L, S)
                mask = mask.reshape(-1, self.num_heads, length, source)
        if key_padding_mask is not None:
            pad = _additive(key_padding_mask, q).reshape(n, 1, 1, source)
            mask = pad if mask is None else mask + pad
        return mask

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")


def _additive(mask, like):
    """A bool mask (True = masked out) as 0 / -inf, a float one as is, in like's dtype."""
    xp = xp_of(like.array)
    m = xp.asarray(mask.array if isinstance(mask, Tensor) else mask)
    return (xp.where(m, -xp.inf, 0.0) if m.dtype.kind == "b" else m).astype(like.dtype)
