"""The LRScheduler base class and the schedules that scale ``base_lr`` by a
factor of the epoch: LambdaLR, MultiplicativeLR, StepLR, MultiStepLR,
ConstantLR, LinearLR, ExponentialLR, PolynomialLR (PyTorch's names and
arguments; ``spmdnet.optim.lr_scheduler`` is the public path).

Every schedule but MultiplicativeLR is a closed form of the epoch counter,
``lr = f(base_lr, last_epoch)``, rather than PyTorch's chained recurrences
(whose closed forms PyTorch documents and uses for ``step(epoch)``), so a
schedule resumed from ``state_dict()`` reproduces exactly the same values
and no floating-point drift builds up over long runs.
"""
import bisect
import warnings

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR",
           "ConstantLR", "LinearLR", "ExponentialLR", "PolynomialLR"]


def check_epochs(name, value, minimum=1):
    """``value`` as an int >= ``minimum``, or ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class LRScheduler:
    """Base class: sets ``group["lr"]`` from ``get_lr()`` on every ``step()``.

    The constructor stores ``initial_lr`` in each param group (unless
    resuming with ``last_epoch >= 0``, which requires it), records
    ``base_lrs`` and performs the first step, so right after construction
    the optimizer's lr is the schedule's value at epoch 0.
    """

    _not_saved = ("optimizer", "lr_lambdas")  # state_dict() leaves these out

    def __init__(self, optimizer, last_epoch=-1):
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in "
                                   f"param_groups[{i}] when resuming an optimizer")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._last_lr = []
        self.step()

    def get_lr(self):
        """The lr of every param group at ``self.last_epoch``."""
        raise NotImplementedError

    def step(self, epoch=None):
        """Advance one epoch (or iteration) and write the new lrs. ``epoch``
        (deprecated in PyTorch, with its warning) jumps to that epoch."""
        if epoch is None:
            self.last_epoch += 1
        else:
            warnings.warn("The epoch parameter in `scheduler.step()` was not necessary and is "
                          "being deprecated where possible. Please use `scheduler.step()` to "
                          "step the scheduler.", UserWarning, stacklevel=2)
            self.last_epoch = epoch
        self._write([float(lr) for lr in self.get_lr()])

    def _write(self, lrs):
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = lrs

    def get_last_lr(self):
        """The lrs written by the last ``step()``."""
        return list(self._last_lr)

    def state_dict(self):
        """Everything but the optimizer (and functions, which cannot be saved)."""
        return {k: (list(v) if isinstance(v, list) else v)
                for k, v in self.__dict__.items() if k not in self._not_saved}

    def load_state_dict(self, state_dict):
        """Restore ``state_dict()`` and write its current lrs into the
        optimizer, so the result does not depend on whether the optimizer's
        own state was loaded before or after; ``step()`` continues from it."""
        self.__dict__.update({k: (list(v) if isinstance(v, list) else v)
                              for k, v in state_dict.items()})
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr


def _per_group(optimizer, fn_or_fns, what):
    """One callable per param group, from one or a list of them."""
    n = len(optimizer.param_groups)
    if isinstance(fn_or_fns, (list, tuple)):
        if len(fn_or_fns) != n:
            raise ValueError(f"expected {n} {what}s, got {len(fn_or_fns)}")
        fns = list(fn_or_fns)
    else:
        fns = [fn_or_fns] * n
    for fn in fns:
        if not callable(fn):
            raise TypeError(f"{what} must be callable, got {fn!r}")
    return fns


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)``; one function, or one per group.

    The functions are not saved by ``state_dict()``: recreate the scheduler
    with the same functions, then load.
    """

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.lr_lambdas = _per_group(optimizer, lr_lambda, "lr_lambda")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * fn(self.last_epoch)
                for base, fn in zip(self.base_lrs, self.lr_lambdas)]


class MultiplicativeLR(LRScheduler):
    """``lr = lr * lr_lambda(epoch)`` from epoch 1 on: the one recurrence
    here, on the optimizer's current lr, as PyTorch (so it composes with
    whatever else set that lr). The functions are not saved."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.lr_lambdas = _per_group(optimizer, lr_lambda, "lr_lambda")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        groups = self.optimizer.param_groups
        if self.last_epoch <= 0:
            return [group["lr"] for group in groups]
        return [group["lr"] * fn(self.last_epoch) for group, fn in zip(groups, self.lr_lambdas)]


class StepLR(LRScheduler):
    """``lr = base_lr * gamma ** (epoch // step_size)``."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size = check_epochs("step_size", step_size)
        if not gamma > 0.0:
            raise ValueError(f"gamma must be positive, got {gamma}")
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        k = self.last_epoch // self.step_size
        return [base * self.gamma ** k for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """``lr = base_lr * gamma ** (number of milestones <= epoch)``; a
    milestone listed twice counts twice, as PyTorch."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones = sorted(check_epochs("each milestone", m, 0) for m in milestones)
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        k = bisect.bisect_right(self.milestones, self.last_epoch)
        return [base * self.gamma ** k for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """``lr = base_lr * factor`` before epoch ``total_iters``, then ``base_lr``."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        if not 0.0 <= factor <= 1.0:
            raise ValueError(f"Constant multiplicative factor expected to be between 0 and 1, "
                             f"got {factor}")
        self.factor, self.total_iters = float(factor), check_epochs("total_iters", total_iters, 0)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        scale = self.factor if self.last_epoch < self.total_iters else 1.0
        return [base * scale for base in self.base_lrs]


class LinearLR(LRScheduler):
    """The factor goes linearly from ``start_factor`` to ``end_factor`` over
    ``total_iters`` epochs, then stays: ``lr = base_lr * (start + (end -
    start) * min(epoch, total_iters) / total_iters)``."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5,
                 last_epoch=-1):
        if not 0.0 < start_factor <= 1.0:
            raise ValueError(f"Starting multiplicative factor expected to be greater than 0 "
                             f"and less or equal to 1, got {start_factor}")
        if not 0.0 <= end_factor <= 1.0:
            raise ValueError(f"Ending multiplicative factor expected to be between 0 and 1, "
                             f"got {end_factor}")
        self.start_factor, self.end_factor = float(start_factor), float(end_factor)
        self.total_iters = check_epochs("total_iters", total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        done = min(self.last_epoch, self.total_iters) / self.total_iters
        scale = self.start_factor + (self.end_factor - self.start_factor) * done
        return [base * scale for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """``lr = base_lr * gamma ** epoch``."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """``lr = base_lr * (1 - min(epoch, total_iters) / total_iters) ** power``."""

    def __init__(self, optimizer, total_iters=5, power=1.0, last_epoch=-1):
        self.total_iters, self.power = check_epochs("total_iters", total_iters), float(power)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        left = 1.0 - min(self.last_epoch, self.total_iters) / self.total_iters
        return [base * left ** self.power for base in self.base_lrs]
