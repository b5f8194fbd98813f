"""Adam (L2 weight decay) and AdamW (decoupled weight decay)."""
import math

from .. import kernels
from ..backend import xp_of
from .optimizer import Optimizer, check_betas, check_nonneg, implementation_flags, scratch, \
    signed_grad


class Adam(Optimizer):
    """Adam with PyTorch's update rule (``torch.optim.Adam``)::

        g = -grad if maximize else grad
        g = g + weight_decay * p                       (L2: Adam's default)
        p *= 1 - lr * weight_decay                     (decoupled: AdamW)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        vmax = max(vmax, v) if amsgrad else v
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        p -= (lr / bc1) * m / (sqrt(vmax) / sqrt(bc2) + eps)

    State per parameter: ``step`` (int), ``exp_avg`` (m), ``exp_avg_sq`` (v),
    ``max_exp_avg_sq`` (vmax, with amsgrad). ``decoupled_weight_decay=True``
    makes Adam AdamW, as in PyTorch; ``foreach``/``fused`` change no number.

    Why the code looks unlike the formula: the training step is benchmarked
    against hand-written NumPy, so every operation is an in-place ufunc
    through one persistent scratch array (no allocation after step 1), and
    the last line uses the algebraically equal form
    ``p -= lr*sqrt(bc2)/bc1 * m / (sqrt(v) + eps*sqrt(bc2))``, which saves
    one full pass over the parameter.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, amsgrad=False, *, foreach=None, maximize=False,
                 capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False):
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": amsgrad, "maximize": maximize,
                    **implementation_flags(type(self).__name__, foreach, differentiable,
                                           capturable=capturable, fused=fused),
                    "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(params, defaults)

    def _validate(self, group):
        check_nonneg("learning rate", group["lr"])
        check_nonneg("epsilon value", group["eps"])
        check_nonneg("weight_decay value", group["weight_decay"])
        check_betas(group["betas"])

    def step(self, closure=None):
        """One update; ``closure`` (optional) re-evaluates and returns the loss."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            b1, b2 = (float(b) for b in group["betas"])
            lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
            decoupled = bool(group.get("decoupled_weight_decay", False))
            self._step_group(group, self._update, lr, b1, b2, eps, wd, decoupled,
                             bool(group.get("amsgrad", False)), bool(group.get("maximize", False)))
        return loss

    @staticmethod
    def _update(data, grad, state, lr, b1, b2, eps, wd, decoupled, amsgrad, maximize):
        xp = xp_of(data, grad)
        if "step" not in state:
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(data)
            state["exp_avg_sq"] = xp.zeros_like(data)
        if amsgrad and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = xp.zeros_like(data)
        state["step"] += 1
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        vmax = state["max_exp_avg_sq"] if amsgrad else None
        kernel = kernels.lookup("adam", data, grad, m, v, vmax, step="update")
        if kernel is not None:  # one fused pass
            kernel(data, grad, m, v, lr, b1, b2, eps, t, wd, decoupled, maximize, vmax)
            return
        tmp = scratch(state, data)
        g = grad = signed_grad(grad, maximize)
        if wd != 0.0:
            if decoupled:
                data *= 1.0 - lr * wd
            else:  # g = grad + wd * p in the scratch, p.grad untouched
                xp.multiply(data, wd, out=tmp)
                tmp += grad
                g = tmp
        # m = g + b1 * (m - g): the same EMA, and needs no temporary,
        # so the scratch may already hold g.
        m -= g
        m *= b1
        m += g
        if g is tmp:  # g is no longer needed: square it in place
            xp.multiply(tmp, tmp, out=tmp)
        else:
            xp.multiply(grad, grad, out=tmp)
        tmp *= 1.0 - b2
        v *= b2
        v += tmp

        if amsgrad:
            xp.maximum(vmax, v, out=vmax)
            v = vmax
        bc1 = 1.0 - b1 ** t
        sqrt_bc2 = math.sqrt(1.0 - b2 ** t)
        xp.sqrt(v, out=tmp)
        tmp += eps * sqrt_bc2
        xp.divide(m, tmp, out=tmp)
        tmp *= lr * sqrt_bc2 / bc1
        data -= tmp


class AdamW(Adam):
    """Adam with decoupled weight decay (``torch.optim.AdamW``): the
    parameter shrinks by ``1 - lr * weight_decay`` before the Adam update,
    instead of the decay being added to the gradient."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2, amsgrad=False, *, maximize=False, foreach=None,
                 capturable=False, differentiable=False, fused=None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
