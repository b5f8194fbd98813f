"""Schedules driven by other schedules or by a metric (``spmdnet.optim.
lr_scheduler`` is the public path): SequentialLR and ReduceLROnPlateau."""
import bisect
import math

from .scheduler import LRScheduler, check_epochs

__all__ = ["SequentialLR", "ReduceLROnPlateau"]


class SequentialLR(LRScheduler):
    """Runs ``schedulers[0]`` until ``milestones[0]``, then ``schedulers[1]``
    from its epoch 0, and so on: at epoch e the active schedule is the one
    after the milestones <= e, at its own epoch ``e - (last milestone <= e)``.

    As PyTorch, the sub-schedulers' first steps (made when they were built)
    are undone: the optimizer starts at ``schedulers[0]``'s epoch-0 value.
    ``state_dict()`` holds the sub-schedulers' states under ``_schedulers``.
    """

    _not_saved = ("optimizer", "_schedulers")

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        schedulers, milestones = list(schedulers), list(milestones)
        if not schedulers:
            raise ValueError("SequentialLR expects at least one scheduler, got none")
        for i, sched in enumerate(schedulers):
            if getattr(sched, "optimizer", None) is not optimizer:
                raise ValueError(f"SequentialLR: scheduler {i} ({type(sched).__name__}) "
                                 "uses another optimizer than the one given")
            if isinstance(sched, ReduceLROnPlateau):
                raise ValueError(f"SequentialLR: scheduler {i} is ReduceLROnPlateau, which "
                                 "needs a metric at each step and cannot be sequenced")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: {len(schedulers)} schedulers need "
                             f"{len(schedulers) - 1} milestones, got {len(milestones)}")
        for m in milestones:
            check_epochs("each milestone", m, 0)
        if milestones != sorted(milestones):
            raise ValueError(f"SequentialLR: milestones must be increasing, got {milestones}")
        self.optimizer, self._schedulers, self._milestones = optimizer, schedulers, milestones
        self.last_epoch = last_epoch + 1
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        for sched in schedulers:  # undo the step each made when it was built
            sched.last_epoch -= 1
        first = schedulers[0]
        first.step()
        self._last_lr = first.get_last_lr()

    def step(self):
        """Advance one epoch; a schedule whose milestone is reached restarts at 0."""
        self.last_epoch += 1
        i = bisect.bisect_right(self._milestones, self.last_epoch)
        sched = self._schedulers[i]
        if i > 0 and self._milestones[i - 1] == self.last_epoch:
            sched.last_epoch = -1  # so that its step goes to its epoch 0
        sched.step()
        self._last_lr = sched.get_last_lr()

    def state_dict(self):
        state = super().state_dict()
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        saved = state.pop("_schedulers")
        if len(saved) != len(self._schedulers):
            raise ValueError(f"SequentialLR: the state holds {len(saved)} schedulers, this one "
                             f"has {len(self._schedulers)}")
        for sched, sub in zip(self._schedulers, saved):
            sched.load_state_dict(sub)
        super().load_state_dict(state)


class ReduceLROnPlateau(LRScheduler):
    """Multiply the lr by ``factor`` once the metric given to ``step(metric)``
    has not improved for more than ``patience`` epochs; then wait
    ``cooldown`` epochs before counting again. Not a closed form: it follows
    the metric.

    Improvement ("min" mode, "rel"): metric < best * (1 - threshold);
    ("abs"): metric < best - threshold; "max" mode mirrors both. A new lr is
    ``max(lr * factor, min_lr)``, written only if it moves by more than
    ``eps``.
    """

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4,
                 threshold_mode="rel", cooldown=0, min_lr=0.0, eps=1e-8):
        if not factor < 1.0:
            raise ValueError(f"Factor should be < 1.0, got {factor}")
        if mode not in ("min", "max"):
            raise ValueError(f"mode {mode!r} is unknown! (use 'min' or 'max')")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"threshold mode {threshold_mode!r} is unknown! (use 'rel' or "
                             "'abs')")
        n = len(optimizer.param_groups)
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != n:
                raise ValueError(f"expected {n} min_lrs, got {len(min_lr)}")
            self.min_lrs = [float(v) for v in min_lr]
        else:
            self.min_lrs = [float(min_lr)] * n
        self.optimizer, self.factor, self.patience = optimizer, float(factor), patience
        self.mode, self.threshold, self.threshold_mode = mode, float(threshold), threshold_mode
        self.cooldown, self.eps = cooldown, float(eps)
        self.last_epoch = 0
        self._last_lr = [float(group["lr"]) for group in optimizer.param_groups]
        self._reset()

    def _reset(self):
        self.best = math.inf if self.mode == "min" else -math.inf
        self.num_bad_epochs, self.cooldown_counter = 0, 0

    @property
    def in_cooldown(self):
        return self.cooldown_counter > 0

    def is_better(self, current, best):
        """Whether ``current`` improves on ``best`` by more than the threshold."""
        if self.mode == "min":
            edge = best * (1.0 - self.threshold) if self.threshold_mode == "rel" \
                else best - self.threshold
            return current < edge
        edge = best * (1.0 + self.threshold) if self.threshold_mode == "rel" \
            else best + self.threshold
        return current > edge

    def step(self, metrics, epoch=None):
        """Record this epoch's metric (a number or a one-element tensor) and
        reduce the lr when it has stalled."""
        current = float(metrics.item() if hasattr(metrics, "item") else metrics)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        if self.is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # epochs in cooldown do not count
        if self.num_bad_epochs > self.patience:
            for group, low in zip(self.optimizer.param_groups, self.min_lrs):
                old = float(group["lr"])
                new = max(old * self.factor, low)
                if old - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [float(group["lr"]) for group in self.optimizer.param_groups]

    def load_state_dict(self, state_dict):
        """Restore ``state_dict()``; the optimizer's lrs are its own state
        (this schedule is not a function of the epoch), so they are not
        written."""
        self.__dict__.update({k: (list(v) if isinstance(v, list) else v)
                              for k, v in state_dict.items()})
