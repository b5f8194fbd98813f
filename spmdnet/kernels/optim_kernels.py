"""Fused optimizer updates (SGD, Adam/AdamW with maximize and amsgrad): one
pass over a parameter instead of four to ten NumPy passes with temporaries.

Each body is plain Python over flat arrays, jitted explicitly; elementwise
loops give the same bits at any thread count, so replicas stay bitwise
identical. Scalars are converted to the parameter's dtype by the wrappers,
so float32 parameters are updated in float32 arithmetic, like the NumPy
path in ``spmdnet.optim`` (the reference).
"""
import math

import numpy as np

from ._cpu import CpuKernel
from ._numba import njit_inline, prange
from ._target import check_target


def _sgd_body(param, grad, buf, lr, momentum, one_minus_damp, weight_decay, nesterov,
              first, sign):
    for i in prange(param.size):
        _sgd_element(i, param, grad, buf, lr, momentum, one_minus_damp, weight_decay,
                     nesterov, first, sign)


@njit_inline
def _sgd_element(i, param, grad, buf, lr, momentum, one_minus_damp, weight_decay, nesterov,
                 first, sign):
    # sign -1 maximizes; as the xp path: no decay term at all when it is 0
    # (0 * inf would be NaN)
    g = sign * grad[i]
    if weight_decay != 0:
        g += weight_decay * param[i]
    if momentum != 0:
        b = g if first else momentum * buf[i] + one_minus_damp * g
        buf[i] = b
        g = g + momentum * b if nesterov else b
    param[i] -= lr * g


def _adam_body(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lr_over_bc1, sqrt_bc2, beta1,
               one_minus_beta1, beta2, one_minus_beta2, eps, l2, decay, sign, amsgrad):
    for i in prange(param.size):
        _adam_element(i, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lr_over_bc1,
                      sqrt_bc2, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, l2, decay,
                      sign, amsgrad)


@njit_inline
def _adam_element(i, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lr_over_bc1, sqrt_bc2,
                  beta1, one_minus_beta1, beta2, one_minus_beta2, eps, l2, decay, sign,
                  amsgrad):
    g = sign * grad[i]  # sign -1 maximizes
    if l2 != 0:
        g += l2 * param[i]
    m = beta1 * exp_avg[i] + one_minus_beta1 * g
    v = beta2 * exp_avg_sq[i] + one_minus_beta2 * (g * g)
    exp_avg[i] = m
    exp_avg_sq[i] = v
    if amsgrad:  # the denominator uses the largest second moment so far
        v = max(max_exp_avg_sq[i], v)
        max_exp_avg_sq[i] = v
    param[i] = param[i] * decay - lr_over_bc1 * m / (math.sqrt(v) / sqrt_bc2 + eps)


_cpu = {"sgd": CpuKernel(_sgd_body), "adam": CpuKernel(_adam_body)}


def _run(name, args):
    check_target("optimizer", args[0])
    _cpu[name](*args)


def sgd_update(param, grad, buf, lr, momentum, dampening, weight_decay, nesterov, first,
               maximize=False):
    """PyTorch's SGD on one parameter, in place (``buf`` may be None without
    momentum); C-contiguous arrays (``kernels.lookup("sgd", ...)`` checks)."""
    t = param.dtype.type
    flat_buf = buf.reshape(-1) if buf is not None else param.reshape(-1)[:0]
    _run("sgd", (param.reshape(-1), grad.reshape(-1), flat_buf, t(lr), t(momentum),
                 t(1 - dampening), t(weight_decay), bool(nesterov), bool(first),
                 t(-1 if maximize else 1)))


def adam_update(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, step,
                weight_decay, decoupled, maximize=False, max_exp_avg_sq=None):
    """PyTorch's Adam (L2 in the gradient) or AdamW (``decoupled``), in place;
    with ``max_exp_avg_sq`` (an array like the parameter), its amsgrad variant."""
    t = param.dtype.type
    bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
    l2, decay = (0.0, 1 - lr * weight_decay) if decoupled else (weight_decay, 1.0)
    amsgrad = max_exp_avg_sq is not None
    flat_max = max_exp_avg_sq.reshape(-1) if amsgrad else param.reshape(-1)[:0]
    _run("adam", (param.reshape(-1), grad.reshape(-1), exp_avg.reshape(-1),
                  exp_avg_sq.reshape(-1), flat_max, t(lr / bc1), t(math.sqrt(bc2)), t(beta1),
                  t(1 - beta1), t(beta2), t(1 - beta2), t(eps), t(l2), t(decay),
                  t(-1 if maximize else 1), amsgrad))


def warmup(dtype):
    """Compile the CPU kernels for ``dtype``."""
    p, g, m, v = (np.ones(3, dtype) for _ in range(4))
    sgd_update(p, g, m, 0.1, 0.9, 0.0, 0.0, False, True)
    adam_update(p, g, m, v, 0.1, 0.9, 0.999, 1e-8, 1, 0.0, False)
