"""StepProfiler: where the time of a training step goes, per rank.

Phases of one step (seconds):
  data       the loop waited for the batch (``DataLoader.wait_s``)
  forward    model and loss
  backward   backward computation (``zero_grad`` and ``loss.backward()``
             minus the exposed communication below)
  comm       the exposed communication: time backward waited for the
             gradient allreduces after its own computation had ended
             (``DataParallel.last_exposed_comm_s``)
  optimizer  ``opt.step()`` (and the scheduler, if marked with it)
  other      the rest of the step, from the last mark to ``end()``
The phases of a step sum to the step. Each rank keeps one row per step;
``summary()`` reduces them to the interquartile mean (the steps whose total
lies between the 25th and 75th percentile, averaged phase by phase): robust
to outliers like a median, and linear, so the phases still sum to the step.

Usage in a training loop (every method is a no-op when ``enabled=False``)::

    prof = StepProfiler(ddp, loader, enabled=args.profile)
    for x, y in loader:
        prof.begin()                 # the batch has arrived: the data wait ends here
        loss = F.cross_entropy(ddp(x), y)
        prof.mark("forward")         # each mark closes the phase it names
        opt.zero_grad()
        loss.backward()
        prof.mark("backward")        # less the exposed allreduce wait: "comm"
        opt.step()
        prof.mark("optimizer")
        prof.end()                   # the rest of the step is "other"
    prof.print_report()              # collective: gathers every rank's summary
"""
import sys
import time

import numpy as np

from .backend import require_cupy
from .distributed import bound_device, comm_or_default, guarded

PHASES = ("data", "forward", "backward", "comm", "optimizer", "other")
MARKS = ("data", "forward", "backward", "optimizer", "other")
# T(N) = T_par/N + T_seq + T_comm: which phases make each part
PARTS = {"parallel": ("data", "forward", "backward"),
         "sequential": ("optimizer", "other"),
         "communication": ("comm",)}


def decompose(phases):
    """The parallel, sequential and communication parts of a step from its
    phases (seconds); they sum to ``step_s`` = the sum of the phases."""
    parts = {f"{part}_s": sum(phases[p] for p in names) for part, names in PARTS.items()}
    parts["step_s"] = sum(phases[p] for p in PHASES)
    return parts


def interquartile_mean(rows):
    """Phase means over the steps whose total is in the middle half
    (all steps when there are fewer than 4). ``rows``: (steps, phases)."""
    rows = np.asarray(rows, float).reshape(-1, len(PHASES))
    if len(rows) == 0:
        return {p: float("nan") for p in PHASES}
    order = np.argsort(rows.sum(axis=1), kind="stable")
    cut = len(rows) // 4
    kept = rows[order[cut:len(rows) - cut]]
    return dict(zip(PHASES, kept.mean(axis=0).tolist()))


class StepProfiler:
    """Times the phases of each training step on this rank (see the module
    docstring). ``ddp``: a DataParallel (or None: no communication);
    ``loader``: a DataLoader (or None: no data wait); ``warmup``: first
    steps not recorded (JIT compilation, first allocations)."""

    def __init__(self, ddp=None, loader=None, comm=None, warmup=3, enabled=True):
        self.ddp, self.loader, self.comm = ddp, loader, comm
        self.warmup, self.enabled = int(warmup), bool(enabled)
        self.rows, self.seen = [], 0
        self._wait = loader.wait_s if loader is not None else 0.0
        self._ddp_steps = ddp.steps if ddp is not None else 0
        self._current = None
        self._last = 0.0
        # GPU kernels run asynchronously: without a wait at every mark their
        # time would land in whichever phase next waits for the device.
        self._on_gpu = bound_device() == "gpu"

    def _now(self):
        if self._on_gpu:
            require_cupy().cuda.get_current_stream().synchronize()
        return time.perf_counter()

    def begin(self):
        """Start a step (right after the batch arrived)."""
        if not self.enabled:
            return
        now = self._now()
        self._current = dict.fromkeys(PHASES, 0.0)
        if self.loader is not None:
            self._current["data"] = self.loader.wait_s - self._wait
            self._wait = self.loader.wait_s
        self._last = now

    def mark(self, phase):
        """The time since the previous mark (or ``begin``) belongs to ``phase``."""
        if not self.enabled:
            return
        if self._current is None:
            raise RuntimeError(f"StepProfiler.mark({phase!r}) outside a step: call begin() first")
        if phase not in MARKS:
            raise ValueError(f"StepProfiler.mark: phase must be one of {MARKS}, got {phase!r}")
        now = self._now()
        elapsed, self._last = now - self._last, now
        if phase == "backward" and self.ddp is not None and self.ddp.steps != self._ddp_steps:
            self._ddp_steps = self.ddp.steps  # this backward reduced: split off its wait
            comm = min(self.ddp.last_exposed_comm_s, elapsed)
            self._current["comm"] += comm
            elapsed -= comm
        self._current[phase] += elapsed

    def end(self):
        """Close the step: the time since the last mark is "other"."""
        if not self.enabled:
            return
        if self._current is None:
            raise RuntimeError("StepProfiler.end() without begin()")
        self._current["other"] += self._now() - self._last
        if self.seen >= self.warmup:
            self.rows.append([self._current[p] for p in PHASES])
        self.seen += 1
        self._current = None

    def summary(self):
        """This rank's interquartile-mean phases, plus ``step`` and ``steps``."""
        phases = interquartile_mean(self.rows)
        totals = np.sum(self.rows, axis=1) if self.rows else np.array([np.nan])
        return dict(phases, step=sum(phases.values()), steps=len(self.rows),
                    step_median=float(np.median(totals)))

    def gather(self):
        """Collective over ``comm`` (default: the world): every rank's
        summary to rank 0, which gets a Breakdown (others get None)."""
        if not self.enabled:
            return None
        comm = comm_or_default(self.comm)
        with guarded("gather(profiler summaries)", comm):
            rows = comm.gather(self.summary(), root=0)
        return Breakdown(rows) if comm.Get_rank() == 0 else None

    def print_report(self, file=None):
        """Collective: gather, then print the breakdown table on rank 0."""
        breakdown = self.gather()
        if breakdown is not None:
            print(breakdown.table(), file=file or sys.stdout, flush=True)
        return breakdown


class Breakdown:
    """Per-rank step summaries (a list of ``StepProfiler.summary()`` dicts)."""

    def __init__(self, ranks):
        self.ranks = list(ranks)

    def mean(self):
        """Phases averaged over ranks (they still sum to the mean step)."""
        return {p: float(np.mean([r[p] for r in self.ranks])) for p in PHASES}

    def imbalance(self):
        """max/min over ranks, per phase and for the step (1.0 = balanced)."""
        out = {}
        for key in PHASES + ("step",):
            values = [r[key] for r in self.ranks]
            lo, hi = min(values), max(values)
            out[key] = 1.0 if hi == lo else (hi / lo if lo > 0 else float("inf"))
        return out

    def parts(self):
        return decompose(self.mean())

    def table(self):
        """The breakdown as text (milliseconds)."""
        head = "".join(f"{p:>10}" for p in PHASES + ("step",))
        steps = self.ranks[0]["steps"]
        lines = [f"step breakdown on {len(self.ranks)} ranks, interquartile mean of "
                 f"{steps} steps, ms", f"{'rank':>8}{head}"]
        for r, row in enumerate(self.ranks):
            lines.append(f"{r:>8}" + "".join(f"{1e3 * row[p]:>10.2f}" for p in PHASES + ("step",)))
        mean = self.mean()
        lines.append(f"{'mean':>8}" + "".join(f"{1e3 * mean[p]:>10.2f}" for p in PHASES)
                     + f"{1e3 * sum(mean.values()):>10.2f}")
        imb = self.imbalance()
        lines.append(f"{'max/min':>8}" + "".join(f"{imb[p]:>10.2f}" for p in PHASES + ("step",)))
        parts = self.parts()
        lines.append(f"T(N) = parallel {1e3 * parts['parallel_s']:.2f} (data+forward+backward) "
                     f"+ sequential {1e3 * parts['sequential_s']:.2f} (optimizer+other) "
                     f"+ communication {1e3 * parts['communication_s']:.2f} (exposed) "
                     f"= {1e3 * parts['step_s']:.2f} ms")
        return "\n".join(lines)
