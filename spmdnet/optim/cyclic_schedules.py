"""Cosine and one-cycle schedules (``spmdnet.optim.lr_scheduler`` is the
public path): CosineAnnealingLR, CosineAnnealingWarmRestarts, OneCycleLR
with PyTorch's closed forms, and spmdnet's WarmupCosine."""
import math

from .scheduler import LRScheduler, check_epochs

__all__ = ["CosineAnnealingLR", "CosineAnnealingWarmRestarts", "OneCycleLR", "WarmupCosine"]


def _cosine(high, low, fraction):
    """From ``high`` (fraction 0) to ``low`` (fraction 1) along half a cosine."""
    return low + (high - low) * (0.5 * (1.0 + math.cos(math.pi * fraction)))


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2``:
    base_lr at 0, eta_min at ``T_max``, and back up after it (the cosine
    goes on, as PyTorch's)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):  # noqa: N803
        self.T_max, self.eta_min = check_epochs("T_max", T_max), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [_cosine(base, self.eta_min, self.last_epoch / self.T_max)
                for base in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """SGDR: cosine from base_lr to eta_min over ``T_i`` epochs, then a
    restart at base_lr with ``T_i *= T_mult`` (``T_0`` first).

    ``T_cur`` (epochs since the last restart) and ``T_i`` are computed from
    the epoch, which ``step(epoch)`` may give as a float (a fraction of an
    epoch per batch, as PyTorch documents; no deprecation warning here).
    """

    def __init__(self, optimizer, T_0, T_mult=1, eta_min=0.0, last_epoch=-1):  # noqa: N803
        self.T_0, self.T_mult = check_epochs("T_0", T_0), check_epochs("T_mult", T_mult)
        self.eta_min = float(eta_min)
        self.T_i, self.T_cur = self.T_0, max(last_epoch, 0)
        super().__init__(optimizer, last_epoch)

    def _cycle(self, epoch):
        """(T_cur, T_i) at ``epoch``: walk the cycles, whose lengths grow
        geometrically, so this is a few iterations at most."""
        if epoch < 0:
            raise ValueError(f"Expected non-negative epoch, but got {epoch}")
        t_cur, t_i = epoch, self.T_0
        if self.T_mult == 1:
            return t_cur % t_i, t_i
        while t_cur >= t_i:
            t_cur -= t_i
            t_i *= self.T_mult
        return t_cur, t_i

    def step(self, epoch=None):
        """Advance one epoch, or go to ``epoch`` (an int or a float)."""
        epoch = self.last_epoch + 1 if epoch is None else epoch
        self.T_cur, self.T_i = self._cycle(epoch)
        self.last_epoch = math.floor(epoch)
        self._write([float(lr) for lr in self.get_lr()])

    def get_lr(self):
        return [_cosine(base, self.eta_min, self.T_cur / self.T_i) for base in self.base_lrs]


class OneCycleLR(LRScheduler):
    """The 1cycle policy, per batch: lr rises from ``max_lr / div_factor`` to
    ``max_lr`` over the first ``pct_start`` of ``total_steps``, then falls to
    ``initial_lr / final_div_factor`` (with ``three_phase``: back to the
    initial lr first, then down); momentum (or Adam's beta1) moves the other
    way between ``max_momentum`` and ``base_momentum``.

    Each phase runs from its start step to its end step (phase one ends at
    ``pct_start * total_steps - 1``, the last at ``total_steps - 1``);
    within it the value goes from start to end by ``anneal_strategy``:
    "cos" (half a cosine) or "linear". Stepping past ``total_steps`` raises,
    as PyTorch.
    """

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85,
                 max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False,
                 last_epoch=-1):
        if total_steps is not None:
            self.total_steps = check_epochs("total_steps", total_steps)
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = check_epochs("epochs", epochs) * \
                check_epochs("steps_per_epoch", steps_per_epoch)
        else:
            raise ValueError("You must define either total_steps OR (epochs AND "
                             "steps_per_epoch)")
        if not 0.0 <= pct_start <= 1.0:
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got "
                             f"{anneal_strategy!r}")
        self.anneal_strategy, self.cycle_momentum = anneal_strategy, cycle_momentum
        self._phases = self._make_phases(float(pct_start), three_phase)
        groups = optimizer.param_groups
        for group, top in zip(groups, self._each(max_lr, len(groups), "max_lr")):
            if last_epoch == -1:
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("optimizer must support momentum or beta1 with "
                                 "`cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            for group, low, high in zip(groups,
                                        self._each(base_momentum, len(groups), "base_momentum"),
                                        self._each(max_momentum, len(groups), "max_momentum")):
                if last_epoch == -1:
                    self._set_momentum(group, high)
                    group["max_momentum"], group["base_momentum"] = high, low
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _each(value, n, name):
        """One value per param group, from one or a list of them."""
        if isinstance(value, (list, tuple)):
            if len(value) != n:
                raise ValueError(f"expected {n} values for {name}, got {len(value)}")
            return [float(v) for v in value]
        return [float(value)] * n

    def _make_phases(self, pct, three_phase):
        """(end step, lr from, lr to, momentum from, momentum to) per phase,
        the values named by their param-group keys."""
        up = pct * self.total_steps - 1
        if three_phase:
            return [(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                    (2 * pct * self.total_steps - 2, "max_lr", "initial_lr", "base_momentum",
                     "max_momentum"),
                    (self.total_steps - 1, "initial_lr", "min_lr", "max_momentum",
                     "max_momentum")]
        return [(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (self.total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]

    def _anneal(self, start, end, fraction):
        if self.anneal_strategy == "cos":
            return _cosine(start, end, fraction)
        return start + (end - start) * fraction

    def _set_momentum(self, group, value):
        if self.use_beta1:
            group["betas"] = (value, *tuple(group["betas"])[1:])
        else:
            group["momentum"] = value

    def get_lr(self):
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"Tried to step {step} times. The specified number of total "
                             f"steps is {self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, (end, lr_a, lr_b, mom_a, mom_b) in enumerate(self._phases):
                if step <= end or i == len(self._phases) - 1:
                    fraction = (step - start) / (end - start)
                    lrs.append(self._anneal(group[lr_a], group[lr_b], fraction))
                    if self.cycle_momentum:
                        self._set_momentum(group, self._anneal(group[mom_a], group[mom_b],
                                                               fraction))
                    break
                start = end
        return lrs


class WarmupCosine(LRScheduler):
    """Linear warmup, then cosine decay to ``min_lr``, then ``min_lr``
    (spmdnet's; PyTorch composes it as SequentialLR(LinearLR, CosineAnnealingLR)).

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
        check_epochs("warmup_steps", warmup_steps, 0)
        check_epochs("total_steps", total_steps, 0)
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
        return [_cosine(base, lo, (e - w) / (t - w)) for base in self.base_lrs]
