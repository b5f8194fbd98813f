"""Group and instance normalisation, PyTorch's ``F.group_norm`` and ``F.instance_norm``.

A group of (N, C, *) input is the row of (N, G, C/G · prod(*)) that the
LayerNorm op normalises over its last axis, so group norm is that op on a
reshaped view followed by a per-channel scale and shift; instance norm is
group norm with one channel per group. With running statistics, instance
norm moves them by the batch mean of each instance's mean and unbiased
variance (training) or normalises by them (``use_input_stats=False``), as
PyTorch does.
"""
from ..autograd.grad_mode import no_grad
from .batchnorm import batch_norm
from .nn_ops import LayerNorm


def _affine(out, weight, bias):
    """out * weight + bias, each (C,) broadcast over (N, C, *)."""
    shape = (1, -1) + (1,) * (out.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):  # noqa: A002
    """Normalise each of ``num_groups`` channel groups of (N, C, *) input by
    its own mean and biased variance, then ``* weight + bias`` per channel."""
    if input.ndim < 2:
        raise ValueError(f"group_norm: expected input of 2 or more dims (N, C, *), got "
                         f"shape {tuple(input.shape)}")
    channels = input.shape[1]
    if num_groups <= 0 or channels % num_groups:
        raise RuntimeError(f"group_norm: expected number of channels in input ({channels}) "
                           f"to be divisible by num_groups ({num_groups})")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (channels,):
            raise RuntimeError(f"group_norm: {name} has shape {tuple(t.shape)}, expected "
                               f"({channels},) for input of shape {tuple(input.shape)}")
    rows = input.reshape(input.shape[0], num_groups, -1)
    out = LayerNorm.apply(rows, eps=eps).reshape(input.shape)
    return _affine(out, weight, bias)


def instance_norm(input, running_mean=None, running_var=None, weight=None,  # noqa: A002
                  bias=None, use_input_stats=True, momentum=0.1, eps=1e-5):
    """Normalise each (sample, channel) of (N, C, *) input over its own
    positions; see the module docstring for the running statistics."""
    if input.ndim < 3:
        raise ValueError(f"instance_norm: expected input of 3 or more dims (N, C, *), got "
                         f"shape {tuple(input.shape)}")
    if not use_input_stats:
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum,
                          eps)
    if running_mean is not None or running_var is not None:
        _update_running(input.array, running_mean, running_var, momentum)
    return group_norm(input, input.shape[1], weight, bias, eps)


def _update_running(x, running_mean, running_var, momentum):
    """running = (1 - momentum) running + momentum (batch mean of the instances'
    mean and unbiased variance)."""
    axes = tuple(range(2, x.ndim))
    count = x[0, 0].size
    with no_grad():
        if running_mean is not None:
            mean = x.mean(axis=axes).mean(axis=0)
            running_mean.array[...] = (1 - momentum) * running_mean.array + momentum * mean
        if running_var is not None:
            var = x.var(axis=axes, ddof=1 if count > 1 else 0).mean(axis=0)
            running_var.array[...] = (1 - momentum) * running_var.array + momentum * var

