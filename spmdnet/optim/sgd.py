"""Stochastic gradient descent with PyTorch's momentum/Nesterov rule."""
from .. import kernels
from ..backend import xp_of
from .optimizer import Optimizer, check_nonneg, implementation_flags, scratch, signed_grad


class SGD(Optimizer):
    """SGD, update rule identical to ``torch.optim.SGD``::

        g = -grad if maximize else grad
        g = g + weight_decay * p
        if momentum:
            buf = g                                  (first step, no dampening)
            buf = momentum * buf + (1 - dampening) * g   (later steps)
            g = g + momentum * buf if nesterov else buf
        p -= lr * g

    Every temporary goes through one scratch array per parameter, so a
    step allocates nothing after the first and ``p.array`` (and ``p.grad``)
    keep their identity and dtype. ``state[p]["momentum_buffer"]`` holds
    the buffer, as in PyTorch. ``foreach``/``fused`` change no number
    (``implementation_flags``).
    """

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0,
                 weight_decay=0.0, nesterov=False, *, maximize=False, foreach=None,
                 differentiable=False, fused=None):
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize,
                    **implementation_flags("SGD", foreach, differentiable, fused=fused)}
        super().__init__(params, defaults)

    def _validate(self, group):
        check_nonneg("learning rate", group["lr"])
        check_nonneg("momentum value", group["momentum"])
        check_nonneg("weight_decay value", group["weight_decay"])
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(
                "Nesterov momentum requires a momentum > 0 and zero dampening, "
                f"got momentum={group['momentum']}, dampening={group['dampening']}")

    def step(self, closure=None):
        """One update; ``closure`` (optional) re-evaluates and returns the loss."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            # Python floats keep float32 arrays float32 (NumPy's weak scalars).
            hyper = (float(group["lr"]), float(group["momentum"]), float(group["dampening"]),
                     float(group["weight_decay"]), group["nesterov"],
                     bool(group.get("maximize", False)))
            self._step_group(group, self._update, *hyper)
        return loss

    @staticmethod
    def _update(data, grad, state, lr, mom, damp, wd, nesterov, maximize):
        xp = xp_of(data, grad)
        kernel = kernels.lookup("sgd", data, grad, step="update")
        if kernel is not None:  # one fused pass
            buf = state.get("momentum_buffer") if mom != 0.0 else None
            first = mom != 0.0 and buf is None
            if first:
                buf = state["momentum_buffer"] = xp.empty_like(data)
            kernel(data, grad, buf, lr, mom, damp, wd, nesterov, first, maximize)
            return
        tmp = scratch(state, data)
        g = grad = signed_grad(grad, maximize)
        if wd != 0.0:  # g = grad + wd * p, never touching p.grad
            xp.multiply(data, wd, out=tmp)
            tmp += grad
            g = tmp
        if mom != 0.0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = g.copy()
            else:
                buf *= mom
                if damp != 0.0:
                    xp.multiply(g, 1.0 - damp, out=tmp)  # g is dead after
                    buf += tmp
                else:
                    buf += g
            if nesterov:  # p -= lr * g; p -= lr * momentum * buf
                xp.multiply(g, lr, out=tmp)
                data -= tmp
                xp.multiply(buf, lr * mom, out=tmp)
            else:
                xp.multiply(buf, lr, out=tmp)
        else:
            xp.multiply(g, lr, out=tmp)
        data -= tmp
