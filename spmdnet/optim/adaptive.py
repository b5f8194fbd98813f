"""Per-coordinate step sizes from running squared gradients: Adagrad,
Adadelta and RMSprop, with PyTorch's update rules, arguments and state keys.

Every update starts from ``decayed_grad`` (``maximize`` flips the sign, L2
``weight_decay`` is added) and changes ``p.array`` and the state arrays in
place, so aliases of the parameter (flat buckets, shards) stay valid.
"""
from ..backend import xp_of
from .optimizer import Optimizer, check_nonneg, decayed_grad, implementation_flags


class Adagrad(Optimizer):
    """``torch.optim.Adagrad``::

        g = (-grad if maximize else grad) + weight_decay * p
        clr = lr / (1 + (t - 1) * lr_decay)
        sum += g * g
        p -= clr * g / (sqrt(sum) + eps)

    State: ``step``, ``sum`` (starting at ``initial_accumulator_value``,
    created with the optimizer, as PyTorch).
    """

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10, foreach=None, *, maximize=False,
                 differentiable=False, fused=None):
        defaults = {"lr": lr, "lr_decay": lr_decay, "eps": eps, "weight_decay": weight_decay,
                    "initial_accumulator_value": initial_accumulator_value,
                    "maximize": maximize,
                    **implementation_flags("Adagrad", foreach, differentiable, fused=fused)}
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p] = {"step": 0, "sum": xp_of(p.array).full_like(
                    p.array, group["initial_accumulator_value"])}

    def _validate(self, group):
        for name in ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"):
            check_nonneg(f"{name} value", group[name])

    def step(self, closure=None):
        """One update; ``closure`` (optional) re-evaluates and returns the loss."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            self._step_group(group, self._update, group)
        return loss

    @staticmethod
    def _update(data, grad, state, group):
        xp = xp_of(data, grad)
        if "sum" not in state:  # a state loaded without it
            state.update(step=0, sum=xp.full_like(data, group["initial_accumulator_value"]))
        state["step"] += 1
        g = decayed_grad(data, grad, group)
        clr = float(group["lr"]) / (1.0 + (state["step"] - 1) * float(group["lr_decay"]))
        state["sum"] += g * g
        data -= clr * g / (xp.sqrt(state["sum"]) + float(group["eps"]))


class Adadelta(Optimizer):
    """``torch.optim.Adadelta``::

        g = (-grad if maximize else grad) + weight_decay * p
        v = rho * v + (1 - rho) * g * g
        delta = sqrt(u + eps) / sqrt(v + eps) * g
        u = rho * u + (1 - rho) * delta * delta
        p -= lr * delta

    State: ``step``, ``square_avg`` (v), ``acc_delta`` (u).
    """

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, foreach=None, *,
                 capturable=False, maximize=False, differentiable=False):
        defaults = {"lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay,
                    "maximize": maximize,
                    **implementation_flags("Adadelta", foreach, differentiable,
                                           capturable=capturable)}
        super().__init__(params, defaults)

    def _validate(self, group):
        for name in ("lr", "eps", "weight_decay"):
            check_nonneg(f"{name} value", group[name])
        if not 0.0 <= group["rho"] <= 1.0:
            raise ValueError(f"Invalid rho value: {group['rho']}")

    def step(self, closure=None):
        """One update; ``closure`` (optional) re-evaluates and returns the loss."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            self._step_group(group, self._update, group)
        return loss

    @staticmethod
    def _update(data, grad, state, group):
        xp = xp_of(data, grad)
        if "square_avg" not in state:
            state.update(step=0, square_avg=xp.zeros_like(data),
                         acc_delta=xp.zeros_like(data))
        state["step"] += 1
        rho, eps = float(group["rho"]), float(group["eps"])
        g = decayed_grad(data, grad, group)
        v, u = state["square_avg"], state["acc_delta"]
        v *= rho
        v += (1.0 - rho) * g * g
        delta = xp.sqrt(u + eps) / xp.sqrt(v + eps) * g
        u *= rho
        u += (1.0 - rho) * delta * delta
        data -= float(group["lr"]) * delta


class RMSprop(Optimizer):
    """``torch.optim.RMSprop``::

        g = (-grad if maximize else grad) + weight_decay * p
        v = alpha * v + (1 - alpha) * g * g
        centered:   a = alpha * a + (1 - alpha) * g;  avg = sqrt(v - a * a) + eps
        otherwise:  avg = sqrt(v) + eps
        momentum:   buf = momentum * buf + g / avg;   p -= lr * buf
        otherwise:  p -= lr * g / avg

    State: ``step``, ``square_avg`` (v), ``momentum_buffer`` (momentum > 0),
    ``grad_avg`` (a, centered).
    """

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                 centered=False, capturable=False, foreach=None, maximize=False,
                 differentiable=False):
        defaults = {"lr": lr, "momentum": momentum, "alpha": alpha, "eps": eps,
                    "centered": centered, "weight_decay": weight_decay, "maximize": maximize,
                    **implementation_flags("RMSprop", foreach, differentiable,
                                           capturable=capturable)}
        super().__init__(params, defaults)

    def _validate(self, group):
        for name in ("lr", "eps", "momentum", "weight_decay", "alpha"):
            check_nonneg(f"{name} value", group[name])

    def step(self, closure=None):
        """One update; ``closure`` (optional) re-evaluates and returns the loss."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            self._step_group(group, self._update, group)
        return loss

    @staticmethod
    def _update(data, grad, state, group):
        xp = xp_of(data, grad)
        alpha, mom = float(group["alpha"]), float(group["momentum"])
        if "square_avg" not in state:
            state.update(step=0, square_avg=xp.zeros_like(data))
        if mom > 0 and "momentum_buffer" not in state:
            state["momentum_buffer"] = xp.zeros_like(data)
        if group["centered"] and "grad_avg" not in state:
            state["grad_avg"] = xp.zeros_like(data)
        state["step"] += 1
        g = decayed_grad(data, grad, group)
        v = state["square_avg"]
        v *= alpha
        v += (1.0 - alpha) * g * g
        if group["centered"]:
            a = state["grad_avg"]
            a *= alpha
            a += (1.0 - alpha) * g
            avg = xp.sqrt(v - a * a)
        else:
            avg = xp.sqrt(v)
        avg += float(group["eps"])
        lr = float(group["lr"])
        if mom > 0:
            buf = state["momentum_buffer"]
            buf *= mom
            buf += g / avg
            data -= lr * buf
        else:
            data -= lr * g / avg
