"""Neural-network ops: softmax, log_softmax, dropout, layer_norm, embedding,
pad, normalize. (Losses: losses.py and pointwise_losses.py.)

layer_norm and embedding's backward run kernels where ``kernels.lookup``
gives them, decided at forward for backward too; the xp code here is their
reference.
"""
import numpy as np

from .. import kernels
from ..autograd import Function
from ..backend import scatter_add, xp_of
from ._util import normalize_axes
from ..random import distributions, generator_for
from .linalg import buffer_for


def _log_softmax(x, axis):
    xp = xp_of(x)
    shifted = x - x.max(axis=axis, keepdims=True)  # stable: largest exponent is 0
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


class Softmax(Function):
    """Over ``axis``; over the last one through ``kernels.lookup("softmax")``
    where that gives kernels (one pass per row, no temporaries)."""

    def forward(self, x, axis=-1):
        last = axis in (-1, x.ndim - 1)
        kernel = kernels.lookup("softmax", x) if last else None
        self.backward_kernel = kernels.lookup("softmax", x, step="backward") if last else None
        self.axis = axis
        if kernel is not None:
            self.out = kernel(x)
            return self.out
        xp = xp_of(x)
        e = xp.exp(x - x.max(axis=axis, keepdims=True))
        self.out = e / e.sum(axis=axis, keepdims=True)
        return self.out

    def backward(self, g):
        if self.backward_kernel is not None and g.dtype == self.out.dtype:
            return self.backward_kernel(g, self.out)
        return self.out * (g - (g * self.out).sum(axis=self.axis, keepdims=True))


class LogSoftmax(Function):
    def forward(self, x, axis=-1):
        self.out, self.axis = _log_softmax(x, axis), axis
        return self.out

    def backward(self, g):
        xp = xp_of(g)
        return g - xp.exp(self.out) * g.sum(axis=self.axis, keepdims=True)


class Dropout(Function):
    """Zero each element with probability p, scale the rest by 1/(1-p), as
    PyTorch's CPU dropout: a mask of Bernoulli(1 - p) draws (float64
    uniforms, PyTorch's stream) divided by 1 - p in x's dtype. On a GPU the
    uniforms come from CuPy's generator."""

    def forward(self, x, p=0.5):
        xp = xp_of(x)
        scale = x.dtype.type(1.0 - p)
        if xp is np:
            keep = distributions.bernoulli_scalar(generator_for(np), x.shape, 1.0 - p, x.dtype)
        else:
            keep = (generator_for(xp).random(x.shape, dtype=np.float64) < 1.0 - p) \
                .astype(x.dtype)
        self.mask = keep / scale
        return x * self.mask

    def backward(self, g):
        return g * self.mask


class LayerNorm(Function):
    """Normalise over the last axis, then scale and shift (weight, bias)."""

    def forward(self, x, *affine, eps=1e-5):
        kernel = kernels.lookup("layer_norm", x, *affine)
        self.backward_kernel = kernels.lookup("layer_norm", x, *affine, step="backward")
        if kernel is not None:  # keeps x, and the row means and 1/std, for backward
            self.x, self.weight = x, affine[0] if affine else None
            out, self.mean, self.rstd = kernel(x, *affine, eps=eps)
            return out
        xp = xp_of(x, *affine)
        mu = x.mean(axis=-1, keepdims=True)
        centered = x - mu
        self.rstd = 1.0 / xp.sqrt((centered * centered).mean(axis=-1, keepdims=True) + eps)
        self.xhat = centered * self.rstd
        if not affine:
            return self.xhat
        self.weight = affine[0]
        return self.xhat * affine[0] + affine[1]

    def backward(self, g):
        need = self.needs_input_grad
        affine = len(need) > 1
        if self.backward_kernel is not None:
            shape, dtype = self.x.shape[-1:], self.x.dtype
            gx, gw, gb = self.backward_kernel(
                g, self.x, self.weight, self.mean, self.rstd,
                want_weight=affine and need[1], want_bias=affine and need[2],
                weight_out=buffer_for(self.dest(1), shape, dtype) if affine else None,
                bias_out=buffer_for(self.dest(2), shape, dtype) if affine else None)
            return (gx, gw, gb) if affine else gx
        gxhat = g * self.weight if affine else g
        gx = None
        if need[0]:
            gx = self.rstd * (gxhat - gxhat.mean(axis=-1, keepdims=True)
                              - self.xhat * (gxhat * self.xhat).mean(axis=-1, keepdims=True))
        if not affine:
            return gx
        lead = tuple(range(g.ndim - 1))
        gw = (g * self.xhat).sum(axis=lead) if need[1] else None
        gb = g.sum(axis=lead) if need[2] else None
        return gx, gw, gb


class Embedding(Function):
    """weight[indices]; backward scatter-adds rows (indices may repeat). The
    row ``padding_idx`` (if given) gets no gradient."""

    def forward(self, weight, indices, padding_idx=None):
        self.shape, self.dtype, self.indices = weight.shape, weight.dtype, indices
        self.padding_idx = padding_idx
        self.backward_kernel = kernels.lookup("embedding", weight, step="backward")
        return weight[indices]

    def backward(self, g):
        if self.backward_kernel is not None:  # in index order, into the gradient buffer
            dest = buffer_for(self.dest(0), self.shape, self.dtype)
            out = self.backward_kernel(g, self.indices, self.shape[0], out=dest)
        else:
            out = xp_of(g).zeros(self.shape, dtype=self.dtype)
            scatter_add(out, self.indices.reshape(-1), g.reshape(-1, self.shape[1]))
        if self.padding_idx is not None:
            out[self.padding_idx] = 0
        return out


def _pad_source(n, before, after, mode):
    """For each output position along a dim of size n, the input position
    it copies (reflect: mirrored without repeating the edge; replicate: the
    edge; circular: wrapped)."""
    positions = range(-before, n + after)
    if mode == "reflect":
        return [abs(i) if abs(i) < n else 2 * (n - 1) - abs(i) for i in positions]
    if mode == "replicate":
        return [min(max(i, 0), n - 1) for i in positions]
    return [i % n for i in positions]  # circular


class Pad(Function):
    """Pad each dim by (before, after): with ``value`` (mode "constant"; a
    negative amount crops), or by indexing the input ("reflect",
    "replicate", "circular"), whose backward adds the copies back."""

    def forward(self, x, widths=(), mode="constant", value=0.0):
        xp = xp_of(x)
        self.shape, self.widths, self.mode = x.shape, widths, mode
        if mode == "constant":
            self.src = tuple(slice(max(0, -b), n - max(0, -a))
                             for n, (b, a) in zip(x.shape, widths))
            self.dst = tuple(slice(max(0, b), max(0, b) + s.stop - s.start)
                             for b, s in zip((w[0] for w in widths), self.src))
            out = xp.full(tuple(n + b + a for n, (b, a) in zip(x.shape, widths)), value, x.dtype)
            out[self.dst] = x[self.src]
            return out
        self.index = [None if b == a == 0 else xp.asarray(_pad_source(n, b, a, mode))
                      for n, (b, a) in zip(x.shape, widths)]
        for axis, idx in enumerate(self.index):
            if idx is not None:
                x = xp.take(x, idx, axis=axis)
        return x

    def backward(self, g):
        xp = xp_of(g)
        if self.mode == "constant":
            out = xp.zeros(self.shape, g.dtype)
            out[self.src] = g[self.dst]
            return out
        for axis in reversed(range(len(self.shape))):
            idx = self.index[axis]
            if idx is not None:
                moved = xp.moveaxis(g, axis, 0)
                out = xp.zeros((self.shape[axis],) + moved.shape[1:], g.dtype)
                scatter_add(out, idx, moved)
                g = xp.moveaxis(out, 0, axis)
        return g


class Normalize(Function):
    """x / max(‖x‖_p, eps) along ``dim``; p may be ``inf`` (the largest |x|,
    its gradient split among ties)."""

    def forward(self, x, p=2.0, dim=1, eps=1e-12):
        xp = xp_of(x)
        self.x, self.p, self.dim, self.eps = x, p, normalize_axes(dim, x.ndim), eps
        a = xp.abs(x)
        if p == float("inf"):
            self.norm = a.max(axis=self.dim, keepdims=True)
        else:
            self.norm = (a ** p).sum(axis=self.dim, keepdims=True) ** (1.0 / p)
        self.denom = xp.maximum(self.norm, eps)
        return x / self.denom

    def backward(self, g):
        xp = xp_of(g)
        x, norm = self.x, self.norm
        through = (g * x).sum(axis=self.dim, keepdims=True) / (self.denom * self.denom)
        through = through * (norm >= self.eps)  # clamp_min passes where norm >= eps
        if self.p == float("inf"):
            ties = xp.abs(x) == norm
            dnorm = xp.sign(x) * ties / ties.sum(axis=self.dim, keepdims=True)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):  # norm 0: masked below
                dnorm = xp.sign(x) * xp.abs(x) ** (self.p - 1) / norm ** (self.p - 1)
            dnorm = xp.where(norm > 0, dnorm, 0)
        return g / self.denom - through * dnorm
