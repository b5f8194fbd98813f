"""Learning-rate schedules in PyTorch's shape (``torch.optim.lr_scheduler``).

Every schedule here is a closed form of the epoch counter, ``lr =
f(base_lr, last_epoch)``, rather than PyTorch's chained recurrences, so a
schedule resumed from ``state_dict()`` reproduces exactly the same values
and no floating-point drift builds up over long runs.
"""
import math

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "WarmupCosine"]


class LRScheduler:
    """Base class: sets ``group["lr"]`` from ``get_lr()`` on every ``step()``.

    The constructor stores ``initial_lr`` in each param group (unless
    resuming with ``last_epoch >= 0``, which requires it), records
    ``base_lrs`` and performs the first step, so right after construction
    the optimizer's lr is the schedule's value at epoch 0.
    """

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

    def step(self):
        """Advance one epoch (or iteration) and write the new lrs."""
        self.last_epoch += 1
        lrs = [float(lr) for lr in self.get_lr()]
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = lrs

    def get_last_lr(self):
        """The lrs written by the last ``step()``."""
        return list(self._last_lr)

    def state_dict(self):
        """Everything but the optimizer (and, in subclasses, functions)."""
        return {k: (list(v) if isinstance(v, list) else v)
                for k, v in self.__dict__.items()
                if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state_dict):
        """Restore ``state_dict()`` and write its current lrs into the
        optimizer, so the result does not depend on whether the optimizer's
        own state was loaded before or after; ``step()`` continues from it."""
        self.__dict__.update({k: (list(v) if isinstance(v, list) else v)
                              for k, v in state_dict.items()})
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)``; one function, or one per group.

    The functions are not saved by ``state_dict()``: recreate the scheduler
    with the same functions, then load.
    """

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        n = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n:
                raise ValueError(f"expected {n} lr_lambdas, got {len(lr_lambda)}")
            fns = list(lr_lambda)
        else:
            fns = [lr_lambda] * n
        for fn in fns:
            if not callable(fn):
                raise TypeError(f"lr_lambda must be callable, got {fn!r}")
        self.lr_lambdas = fns
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * fn(self.last_epoch)
                for base, fn in zip(self.base_lrs, self.lr_lambdas)]


class StepLR(LRScheduler):
    """``lr = base_lr * gamma ** (epoch // step_size)``."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        if isinstance(step_size, bool) or not isinstance(step_size, int) \
                or step_size < 1:
            raise ValueError(f"step_size must be a positive int, got {step_size!r}")
        if not gamma > 0.0:
            raise ValueError(f"gamma must be positive, got {gamma}")
        self.step_size, self.gamma = step_size, float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        k = self.last_epoch // self.step_size
        return [base * self.gamma ** k for base in self.base_lrs]


class WarmupCosine(LRScheduler):
    """Linear warmup, then cosine decay to ``min_lr``, then ``min_lr``.

    With ``W = warmup_steps`` and ``T = total_steps``::

        epoch < W:       lr = base * (epoch + 1) / W
        W <= epoch < T:  lr = min_lr + 0.5 * (base - min_lr)
                                  * (1 + cos(pi * (epoch - W) / (T - W)))
        epoch >= T:      lr = min_lr

    The warmup starts at ``base / W`` rather than 0 so that no step is
    wasted at lr 0, and reaches ``base`` at epoch ``W - 1``; the cosine
    phase starts at ``base`` (epoch ``W``) and would reach ``min_lr``
    exactly at ``T``. ``warmup_steps=0`` gives plain cosine decay.
    """

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr=0.0,
                 last_epoch=-1):
        for name, value in (("warmup_steps", warmup_steps),
                            ("total_steps", total_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if total_steps < 1 or warmup_steps > total_steps:
            raise ValueError(f"need 0 <= warmup_steps <= total_steps and "
                             f"total_steps >= 1, got warmup_steps={warmup_steps}, "
                             f"total_steps={total_steps}")
        if not min_lr >= 0.0:
            raise ValueError(f"min_lr must be non-negative, got {min_lr}")
        self.warmup_steps, self.total_steps = warmup_steps, total_steps
        self.min_lr = float(min_lr)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        e, w, t, lo = self.last_epoch, self.warmup_steps, self.total_steps, self.min_lr
        if e < w:
            return [base * (e + 1) / w for base in self.base_lrs]
        if e >= t:
            return [lo] * len(self.base_lrs)
        cos = 0.5 * (1.0 + math.cos(math.pi * (e - w) / (t - w)))
        return [lo + (base - lo) * cos for base in self.base_lrs]
