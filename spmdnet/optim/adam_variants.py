"""Adam's variants NAdam (Nesterov momentum) and RAdam (rectified variance),
with PyTorch's update rules, arguments and state keys.

Both start from ``decayed_grad``: ``maximize`` flips the sign; weight decay
is L2 (added to the gradient) or, with ``decoupled_weight_decay``, AdamW's
shrinking of the parameter. Moments are updated in place.
"""
import math

from ..backend import xp_of
from .optimizer import Optimizer, check_betas, check_nonneg, decayed_grad, \
    implementation_flags


class _AdamLike(Optimizer):
    """Shared arguments, checks and first-moment/second-moment update."""

    def _validate(self, group):
        for name in ("lr", "eps", "weight_decay"):
            check_nonneg(f"{name} value", group[name])
        check_betas(group["betas"])

    @staticmethod
    def _moments(data, grad, state, group):
        """Step the counter and both moments; returns (g, m, v, t, b1, b2)."""
        xp = xp_of(data, grad)
        if "exp_avg" not in state:
            state.update(step=0, exp_avg=xp.zeros_like(data), exp_avg_sq=xp.zeros_like(data))
        state["step"] += 1
        b1, b2 = (float(b) for b in group["betas"])
        g = decayed_grad(data, grad, group)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= b1
        m += (1.0 - b1) * g
        v *= b2
        v += (1.0 - b2) * g * g
        return g, m, v, state["step"], b1, b2


class NAdam(_AdamLike):
    """``torch.optim.NAdam`` (ψ = ``momentum_decay``)::

        mu_t = b1 * (1 - 0.5 * 0.96 ** (t * ψ)),   mu_{t+1} likewise
        mu_product *= mu_t
        m, v: Adam's moments of g
        denom = sqrt(v / (1 - b2**t)) + eps
        p -= lr * (1 - mu_t) / (1 - mu_product) * g / denom
        p -= lr * mu_{t+1} / (1 - mu_product * mu_{t+1}) * m / denom

    State: ``step``, ``mu_product`` (a float, 1 at the start), ``exp_avg``,
    ``exp_avg_sq``.
    """

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 momentum_decay=4e-3, decoupled_weight_decay=False, *, foreach=None,
                 maximize=False, capturable=False, differentiable=False):
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "momentum_decay": momentum_decay,
                    "decoupled_weight_decay": decoupled_weight_decay, "maximize": maximize,
                    **implementation_flags("NAdam", foreach, differentiable,
                                           capturable=capturable)}
        super().__init__(params, defaults)

    def _validate(self, group):
        super()._validate(group)
        check_nonneg("momentum_decay value", group["momentum_decay"])

    def step(self, closure=None):
        """One update; ``closure`` (optional) re-evaluates and returns the loss."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            self._step_group(group, self._update, group)
        return loss

    @classmethod
    def _update(cls, data, grad, state, group):
        xp = xp_of(data, grad)
        state.setdefault("mu_product", 1.0)
        g, m, v, t, b1, b2 = cls._moments(data, grad, state, group)
        psi, lr = float(group["momentum_decay"]), float(group["lr"])
        mu = b1 * (1.0 - 0.5 * 0.96 ** (t * psi))
        mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * psi))
        state["mu_product"] = product = float(state["mu_product"]) * mu
        denom = xp.sqrt(v / (1.0 - b2 ** t)) + float(group["eps"])
        data -= (lr * (1.0 - mu) / (1.0 - product)) * g / denom
        data -= (lr * mu_next / (1.0 - product * mu_next)) * m / denom


class RAdam(_AdamLike):
    """``torch.optim.RAdam``::

        m, v: Adam's moments of g;  m_hat = m / (1 - b1**t)
        rho_inf = 2 / (1 - b2) - 1
        rho_t = rho_inf - 2 t b2**t / (1 - b2**t)
        rho_t > 5:  r = sqrt((rho_t-4)(rho_t-2) rho_inf / ((rho_inf-4)(rho_inf-2) rho_t))
                    p -= lr * m_hat * r * sqrt(1 - b2**t) / (sqrt(v) + eps)
        otherwise:  p -= lr * m_hat       (the variance estimate is not yet usable)

    State: ``step``, ``exp_avg``, ``exp_avg_sq``.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 decoupled_weight_decay=False, *, foreach=None, maximize=False,
                 capturable=False, differentiable=False):
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "maximize": maximize,
                    **implementation_flags("RAdam", foreach, differentiable,
                                           capturable=capturable),
                    "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(params, defaults)

    def step(self, closure=None):
        """One update; ``closure`` (optional) re-evaluates and returns the loss."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            self._step_group(group, self._update, group)
        return loss

    @classmethod
    def _update(cls, data, grad, state, group):
        xp = xp_of(data, grad)
        _, m, v, t, b1, b2 = cls._moments(data, grad, state, group)
        lr = float(group["lr"])
        bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
        rho_inf = 2.0 / (1.0 - b2) - 1.0
        rho_t = rho_inf - 2.0 * t * b2 ** t / bc2
        if rho_t > 5.0:
            rect = math.sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf
                             / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t))
            data -= (lr * rect * math.sqrt(bc2) / bc1) * m / (xp.sqrt(v) + float(group["eps"]))
        else:
            data -= (lr / bc1) * m
