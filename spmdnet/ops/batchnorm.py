"""Batch normalization over the channel dim of (N, C, *) input, PyTorch's
semantics: training normalises with the batch's biased variance and moves the
running variance towards the unbiased one; eval uses the running statistics.

The statistics are computed once, outside the op (``moments``), so that a
synchronised layer (``spmdnet.parallel.sync_batchnorm``) can combine them
over a group of ranks before normalising; it passes a ``group`` with
``combine(count, mean, m2)`` and ``allreduce(sums)``. The op's backward
needs two per-channel sums (of dy and of dy·x̂): with a group, they are
summed over the group, and the count is the group's.

Where ``kernels.lookup("batch_norm")`` gives kernels (NumPy float32/64),
``batch_norm`` decides once for the statistics, the forward and the
backward: the statistics and the backward's sums are then float64 (the
per-channel arithmetic between the passes too) and each full-size pass is
one kernel (``spmdnet.kernels.batch_norm``, re-exported by ``kernels.norm``;
with no group, the backward's sums and input gradient are one call, a block
of channels at a time); the xp code here is their reference. ResNet-18's BatchNorm2d layers (batch
32, 1 thread) took 13 against 34 ms of a step with the xp code.
"""
import numpy as np

from .. import kernels
from ..autograd import Function
from ..backend import xp_of

# What a training forward and its backward run, all or none ("fused_backward":
# the sums and the input gradient in one call, where no group combines the sums).
KERNEL_STEPS = ("moments", "forward", "sums", "backward", "fused_backward")
EVAL_STEPS = ("forward", "sums")  # eval: the affine pass; the weight's gradient sums


def channel_axes(ndim):
    """Every axis but the channel axis 1."""
    return (0,) + tuple(range(2, ndim))


def per_channel(a, ndim):
    """A (C,) array shaped to broadcast against (N, C, *)."""
    return a.reshape((1, -1) + (1,) * (ndim - 2))


def batch_kernels(x, *affine, steps=KERNEL_STEPS):
    """{step: kernel} for ``steps`` on these arrays, or None (xp code)."""
    found = {}
    for step in steps:
        found[step] = kernels.lookup("batch_norm", x, *affine, step=step)
        if found[step] is None:
            return None
    return found


def moments(x, kernel=None):
    """(count, mean, m2) per channel of ``x`` (N, C, *): m2 = Σ (x - mean)²;
    float64 from the ``kernel`` (``batch_kernels``'s "moments"), else x's dtype."""
    if x.size == 0:  # a rank with no samples in a synchronised layer
        zeros = xp_of(x).zeros(x.shape[1], x.dtype)
        return 0, zeros, zeros.copy()
    count = x.size // x.shape[1]
    if kernel is not None:
        return (count, *kernel(x))
    axes = channel_axes(x.ndim)
    mean = x.mean(axis=axes)
    centered = x - per_channel(mean, x.ndim)
    return count, mean, (centered * centered).sum(axis=axes)


class BatchNorm(Function):
    """Training: x̂ = (x - mean) * rstd with the batch's statistics (``mean``
    and ``m2`` = Σ (x - mean)² over ``count`` values per channel, over
    ``group``'s ranks when given), rstd = 1/sqrt(m2/count + eps), out = x̂ *
    weight + bias; backward differentiates through the statistics. Running
    statistics given (``running``, two arrays or None) move by ``momentum``.

    Forward is one affine pass per channel (out = x·scale + shift) and saves
    the input, not x̂; backward recomputes x - mean once and writes the input
    gradient as g·A + (x - mean)·B + C per channel: 2 full-size passes fewer
    forward and 1 fewer backward than materialising x̂ (BatchNorm was ~9% of
    a ResNet-18 step). ``kernels``: ``batch_kernels``' (then mean and m2 are
    float64, and the kernels do the per-channel arithmetic too), or None."""

    def forward(self, x, *affine, mean, m2, count, eps, running=(None, None), momentum=0.0,
                group=None, kernels=None):
        nd = x.ndim
        self.count, self.group, self.affine, self.kernels = count, group, bool(affine), kernels
        self.x, self.mean = x, mean
        self.weight = affine[0] if affine else None
        if kernels is not None:
            out, self.rstd = kernels["forward"](x, mean, m2, count, eps, *affine,
                                                running=running, momentum=momentum)
            return out
        self.rstd = 1.0 / xp_of(x).sqrt(m2 / count + x.dtype.type(eps))
        if running[0] is not None:
            _update(running[0], mean, momentum)
        if running[1] is not None:
            _update(running[1], m2 / (count - 1), momentum)
        self.scale = self.rstd * affine[0] if affine else self.rstd
        shift = (affine[1] if affine else 0) - mean * self.scale
        out = x * per_channel(self.scale, nd)
        out += per_channel(shift, nd)
        return out

    def backward(self, g):
        need, nd = self.needs_input_grad, g.ndim
        xp = xp_of(g)
        gw = gb = gx = None
        if self.kernels is not None and self.group is None and need[0]:  # one call
            gx, sums = self.kernels["fused_backward"](g, self.x, self.mean, self.rstd,
                                                      self.weight, self.count)
        elif self.kernels is not None:  # float64 (2, C): Σ g, Σ g·(x - mean)·rstd
            sums = self.kernels["sums"](g, self.x, self.mean)
            sums[1] *= self.rstd
            centered = None
        else:
            axes = channel_axes(nd)
            centered = self.x - per_channel(self.mean, nd)
            sum_g = g.sum(axis=axes)
            sum_gxhat = (g * centered).sum(axis=axes) * self.rstd
            sums = xp.stack([sum_g, sum_gxhat])
        if self.affine:  # the local sums: DataParallel averages them
            gw = sums[1].astype(g.dtype) if need[1] else None
            gb = sums[0].astype(g.dtype) if need[2] else None
        if self.group is not None:  # every rank of the group reduces, whatever it needs
            sums = self.group.allreduce(sums)
        if need[0] and gx is None:
            # scale·(g - mean(g) - x̂·mean(g·x̂)) with x̂ = centered·rstd
            if self.kernels is not None:
                gx = self.kernels["backward"](g, self.x, self.mean, self.rstd, self.weight,
                                              sums, self.count)
            else:
                mean_g, mean_gxhat = sums * sums.dtype.type(1.0 / self.count)
                x_scale, shift = -self.scale * self.rstd * mean_gxhat, -self.scale * mean_g
                gx = g * per_channel(self.scale, nd)
                centered *= per_channel(x_scale, nd)
                gx += centered
                gx += per_channel(shift, nd)
        self.x = None
        return (gx, gw, gb) if self.affine else gx


class BatchNormEval(Function):
    """x * scale + shift with scale = weight * rstd, rstd = 1/sqrt(var +
    eps), shift = bias - mean * scale: normalisation by fixed (running)
    statistics. ``kernels`` as in ``BatchNorm``: out = (x - mean)·scale +
    bias, sums in float64."""

    def forward(self, x, *affine, mean, var, eps, kernels=None):
        nd = x.ndim
        self.affine, self.kernels, self.eps = bool(affine), kernels, eps
        self.x = x if affine else None
        self.weight = affine[0] if affine else None
        # copies: the running statistics may move before this backward runs
        self.mean, self.var = (mean.copy(), var.copy()) if self.needs_input_grad else (mean, var)
        if kernels is not None:
            out, self.rstd = kernels["forward"](x, mean, var, 1, eps, *affine)
            return out
        var, mean = var.astype(x.dtype, copy=False), self.mean.astype(x.dtype, copy=False)
        self.rstd = 1.0 / xp_of(x).sqrt(var + x.dtype.type(eps))
        self.mean = mean
        self.scale = self.rstd * affine[0] if affine else self.rstd
        shift = -mean * self.scale + (affine[1] if affine else 0)
        return x * per_channel(self.scale, nd) + per_channel(shift, nd)

    def backward(self, g):
        need, axes, nd = self.needs_input_grad, channel_axes(g.ndim), g.ndim
        if self.kernels is not None:  # gx = (g - 0)·rstd·weight
            gx = None
            if need[0]:
                zeros = xp_of(g).zeros(g.shape[1], self.var.dtype)
                gx = self.kernels["forward"](g, zeros, self.var, 1, self.eps, self.weight)[0]
            if not self.affine:
                return gx
            sums = self.kernels["sums"](g, self.x, self.mean)
            gw = (sums[1] * self.rstd).astype(g.dtype) if need[1] else None
            gb = sums[0].astype(g.dtype) if need[2] else None
            return gx, gw, gb
        gx = g * per_channel(self.scale, nd) if need[0] else None
        if not self.affine:
            return gx
        xhat = (self.x - per_channel(self.mean, nd)) * per_channel(self.rstd, nd)
        gw = (g * xhat).sum(axis=axes) if need[1] else None
        gb = g.sum(axis=axes) if need[2] else None
        return gx, gw, gb


def _update(data, value, momentum):
    """data ← (1 - momentum) * data + momentum * value, in place, in float64
    (PyTorch updates in its accumulation type, double on the CPU)."""
    data[...] = momentum * value.astype(np.float64) + (1.0 - momentum) * data.astype(np.float64)


def _check(input, running_mean, running_var, weight, bias):  # noqa: A002
    if input.ndim < 2:
        raise ValueError(f"batch_norm: expected input of 2 or more dims (N, C, *), "
                         f"got shape {tuple(input.shape)}")
    channels = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (channels,):
            raise ValueError(f"batch_norm: {name} has shape {tuple(t.shape)}, expected "
                             f"({channels},) for input of shape {tuple(input.shape)}")
    if (weight is None) != (bias is None):
        raise ValueError("batch_norm: give both weight and bias, or neither")


def batch_norm(input, running_mean, running_var, weight=None, bias=None,  # noqa: A002
               training=False, momentum=0.1, eps=1e-5, group=None):
    """PyTorch's ``F.batch_norm``: ``input`` (N, C, *); ``running_mean`` and
    ``running_var`` (C,) Tensors or None; ``weight``/``bias`` (C,) or None.
    Training (or no running statistics): normalise by the batch's statistics
    and, where running ones are given, update them in place with ``momentum``
    (the unbiased variance). Eval: normalise by the running statistics.
    ``group`` (not in PyTorch): combine the statistics over a group of ranks
    (see ``spmdnet.parallel.sync_batchnorm``)."""
    _check(input, running_mean, running_var, weight, bias)
    affine = (weight, bias) if weight is not None else ()
    x = input.array
    if not training:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm: running_mean and running_var are required "
                             "when training=False")
        mean, var = running_mean.array, running_var.array
        found = batch_kernels(x, *(t.array for t in affine), mean, var, steps=EVAL_STEPS)
        return BatchNormEval.apply(input, *affine, mean=mean, var=var, eps=eps, kernels=found)
    update = momentum is not None and momentum != 0
    running = tuple(t.array if t is not None and update else None
                    for t in (running_mean, running_var))
    found = batch_kernels(x, *(t.array for t in affine), *running)
    count, mean, m2 = moments(x, found and found["moments"])
    if group is not None:
        count, mean, m2 = group.combine(count, mean, m2)
    if found is None:  # the xp reference computes in x's dtype
        mean, m2 = mean.astype(x.dtype, copy=False), m2.astype(x.dtype, copy=False)
    if count <= 1:
        raise ValueError(f"batch_norm: expected more than 1 value per channel when "
                         f"training, got input of shape {tuple(input.shape)}")
    return BatchNorm.apply(input, *affine, mean=mean, m2=m2, count=count, eps=eps,
                           running=running, momentum=momentum if update else 0.0,
                           group=group, kernels=found)
