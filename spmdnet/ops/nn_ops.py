"""Neural-network ops: softmax, log_softmax, cross_entropy, mse_loss,
dropout, layer_norm, embedding.

cross_entropy, layer_norm and embedding's backward run kernels where
``kernels.lookup`` gives them, decided at forward for backward too; the xp
code here is their reference.
"""
from .. import kernels
from ..autograd import Function
from ..backend import scatter_add, xp_of
from ..random import generator_for
from .linalg import buffer_for


def _log_softmax(x, axis):
    xp = xp_of(x)
    shifted = x - x.max(axis=axis, keepdims=True)  # stable: largest exponent is 0
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


class Softmax(Function):
    def forward(self, x, axis=-1):
        xp = xp_of(x)
        e = xp.exp(x - x.max(axis=axis, keepdims=True))
        self.out, self.axis = e / e.sum(axis=axis, keepdims=True), axis
        return self.out

    def backward(self, g):
        return self.out * (g - (g * self.out).sum(axis=self.axis, keepdims=True))


class LogSoftmax(Function):
    def forward(self, x, axis=-1):
        self.out, self.axis = _log_softmax(x, axis), axis
        return self.out

    def backward(self, g):
        xp = xp_of(g)
        return g - xp.exp(self.out) * g.sum(axis=self.axis, keepdims=True)


class CrossEntropy(Function):
    """Fused log_softmax + negative log likelihood over logits (N, C) and
    integer labels (N,); reduction "mean", "sum" or "none"."""

    def forward(self, logits, labels, reduction="mean"):
        n = logits.shape[0]
        self.labels, self.reduction = labels, reduction
        kernel = kernels.lookup("cross_entropy", logits)
        self.backward_kernel = kernels.lookup("cross_entropy", logits, step="backward")
        if kernel is not None:  # keeps the softmax (N, C) for backward
            losses, self.probs = kernel(logits, labels)
        else:
            xp = xp_of(logits, labels)
            self.logp = _log_softmax(logits, axis=1)
            losses = -self.logp[xp.arange(n), labels]
        if reduction == "none":
            return losses
        total = losses.sum()
        return total / n if reduction == "mean" else total

    def backward(self, g):
        xp = xp_of(g)
        n = self.labels.shape[0]
        if self.reduction == "none":
            scale = g
        else:
            scale = g / n if self.reduction == "mean" else g
        if self.backward_kernel is not None:
            scale = xp.full(n, scale, dtype=self.probs.dtype) if self.reduction != "none" \
                else scale.astype(self.probs.dtype, copy=False)
            return self.backward_kernel(self.probs, self.labels, scale), None
        grad = xp.exp(self.logp)  # softmax
        grad[xp.arange(n), self.labels] -= 1
        grad *= scale[:, None] if self.reduction == "none" else scale
        return grad, None


class MSELoss(Function):
    def forward(self, a, b, reduction="mean"):
        self.diff, self.reduction = a - b, reduction
        sq = self.diff * self.diff
        if reduction == "none":
            return sq
        return sq.mean() if reduction == "mean" else sq.sum()

    def backward(self, g):
        scale = 2.0 / self.diff.size if self.reduction == "mean" else 2.0
        ga = (g * scale) * self.diff
        need_a, need_b = self.needs_input_grad
        return (ga if need_a else None), (-ga if need_b else None)


class Dropout(Function):
    """Zero each element with probability p, scale the rest by 1/(1-p)."""

    def forward(self, x, p=0.5):
        xp = xp_of(x)
        keep = generator_for(xp).random(x.shape, dtype=x.dtype) >= p
        self.mask = keep * x.dtype.type(1.0 / (1.0 - p))
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
    """weight[indices]; backward scatter-adds rows (indices may repeat)."""

    def forward(self, weight, indices):
        self.shape, self.dtype, self.indices = weight.shape, weight.dtype, indices
        self.backward_kernel = kernels.lookup("embedding", weight, step="backward")
        return weight[indices]

    def backward(self, g):
        if self.backward_kernel is not None:  # in index order, into the gradient buffer
            dest = buffer_for(self.dest(0), self.shape, self.dtype)
            return self.backward_kernel(g, self.indices, self.shape[0], out=dest)
        out = xp_of(g).zeros(self.shape, dtype=self.dtype)
        scatter_add(out, self.indices.reshape(-1), g.reshape(-1, self.shape[1]))
        return out
