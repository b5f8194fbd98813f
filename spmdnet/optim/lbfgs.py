"""``torch.optim.LBFGS``: limited-memory BFGS over all parameters as one
flat vector, with PyTorch's arguments, defaults, stopping rules, state
keys and optional strong-Wolfe line search, so that a program's iterates
and closure calls are PyTorch's.

One ``step(closure)`` runs up to ``max_iter`` iterations (and ``max_eval``
closure calls). Each direction is the two-loop recursion over the last
``history_size`` curvature pairs (s, y), a pair kept only when yᵀs > 1e-10,
the initial Hessian scaled by yᵀs / yᵀy. The first iteration of the first
step moves by ``min(1, 1 / |g|₁) · lr``, later ones by ``lr``, or by what
the line search finds. It stops at a gradient with max |g| <= tolerance_grad,
at a directional derivative above -tolerance_change, at a step or loss change
below tolerance_change, or when the iterations or evaluations run out.

The strong-Wolfe search (sufficient decrease c1 = 1e-4, curvature c2 = 0.9,
25 trials) brackets a step by safeguarded cubic interpolation, then zooms
into the bracket, pushing a trial that lands too close to an end (within a
tenth of the bracket) away from it once progress stalls: the Moré-Thuente
style search of Nocedal and Wright's Algorithms 3.5 and 3.6, in PyTorch's
variant. Scalars (dot products, losses) are Python floats.
"""
import numpy as np

from ..autograd.grad_mode import enable_grad
from ..backend import asnumpy, xp_of
from .optimizer import Optimizer

# The state, all kept under the first parameter as PyTorch keeps it, by kind:
# vectors over all parameters flattened, lists of such vectors, scalars.
_FLAT = ("d", "prev_flat_grad")
_FLAT_LISTS = ("old_dirs", "old_stps")
_SCALARS = ("t", "H_diag", "prev_loss")
_COUNTS = ("n_iter", "func_evals")


class LBFGS(Optimizer):
    """``LBFGS(params, lr=1, max_iter=20, max_eval=None (max_iter * 5 // 4),
    tolerance_grad=1e-7, tolerance_change=1e-9, history_size=100,
    line_search_fn=None or "strong_wolfe")``; one parameter group only, as
    PyTorch's. ``step(closure)`` needs the closure (it re-evaluates the
    loss and gradients) and returns its first loss."""

    def __init__(self, params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7,
                 tolerance_change=1e-9, history_size=100, line_search_fn=None):
        if isinstance(lr, (int, float)) and lr < 0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        if line_search_fn not in (None, "strong_wolfe"):
            raise ValueError(f"LBFGS: line_search_fn must be None or 'strong_wolfe', got "
                             f"{line_search_fn!r}")
        defaults = {"lr": lr, "max_iter": max_iter, "max_eval": max_eval,
                    "tolerance_grad": tolerance_grad, "tolerance_change": tolerance_change,
                    "history_size": history_size, "line_search_fn": line_search_fn}
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]

    # -- checkpointing: the state is flat vectors, lists and scalars --------

    def _save_state_value(self, key, value):
        if key in _FLAT_LISTS:
            return [np.array(asnumpy(v), copy=True) for v in value]
        if key == "ro":
            return [float(v) for v in value]
        return super()._save_state_value(key, value)

    def _load_state_value(self, idx, p, key, value):
        where = f"LBFGS state '{key}' of parameter {idx}"
        if key in _FLAT or key in _FLAT_LISTS:
            size = sum(q.array.size for q in self._params)
            dtype = np.result_type(*(q.array.dtype for q in self._params))
            xp = xp_of(self._params[0].array)

            def flat(v):
                if tuple(np.shape(v)) != (size,):
                    raise ValueError(f"{where} has shape {tuple(np.shape(v))}, the "
                                     f"parameters flattened have shape ({size},)")
                return xp.array(asnumpy(v), dtype=dtype)  # a copy, on the params' device

            if key in _FLAT:
                return flat(value)
            return [flat(v) for v in _as_list(where, value)]
        if key == "ro":
            return [_scalar(where, v) for v in _as_list(where, value)]
        if key in _SCALARS:
            return _scalar(where, value)
        if key in _COUNTS:
            return int(_scalar(where, value))
        raise ValueError(f"{where}: not a key of LBFGS's state (expected one of "
                         f"{_FLAT + _FLAT_LISTS + ('ro',) + _SCALARS + _COUNTS})")

    def load_state_dict(self, state_dict):
        # PyTorch's checkpoints also hold ``al``, its buffer for the two-loop
        # coefficients, rewritten before it is read in every step: nothing
        # to restore, so it is dropped.
        state = {i: {k: v for k, v in st.items() if k != "al"}
                 for i, st in state_dict["state"].items()}
        super().load_state_dict({**state_dict, "state": state})

    # -- the parameters as one flat vector ----------------------------------

    def _flat_grad(self):
        xp = xp_of(self._params[0].array)
        return xp.concatenate([xp.zeros(p.array.size, p.array.dtype) if p.grad is None
                               else p.grad.array.reshape(-1) for p in self._params])

    def _add(self, step, direction):
        """Every parameter += step · its slice of ``direction`` (in place)."""
        offset = 0
        for p in self._params:
            n = p.array.size
            p.array += step * direction[offset:offset + n].reshape(p.array.shape)
            offset += n

    def _evaluate(self, closure, start, step, direction):
        """(loss, flat gradient) at start + step · direction; the
        parameters are put back to ``start`` afterwards."""
        self._add(step, direction)
        with enable_grad():
            loss = float(closure())
        grad = self._flat_grad()
        for p, saved in zip(self._params, start):
            p.array[...] = saved
        return loss, grad

    # -- the step ----------------------------------------------------------------

    def step(self, closure):
        if closure is None:
            raise RuntimeError("LBFGS.step() needs a closure that re-evaluates the loss")
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tol_grad, tol_change = group["tolerance_grad"], group["tolerance_change"]
        state = self.state.setdefault(self._params[0], {})
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        with enable_grad():
            first_loss = closure()
        loss = float(first_loss)
        evals = 1
        state["func_evals"] += 1
        grad = self._flat_grad()
        xp = xp_of(grad)
        if float(xp.abs(grad).max()) <= tol_grad:
            return first_loss
        d, t = state.get("d"), state.get("t")
        old_dirs, old_stps, ro = (state.get(k) for k in ("old_dirs", "old_stps", "ro"))
        h_diag, prev_grad, prev_loss = (state.get(k) for k in ("H_diag", "prev_flat_grad",
                                                                 "prev_loss"))
        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                d, old_dirs, old_stps, ro, h_diag = -grad, [], [], [], 1.0
            else:
                y, s = grad - prev_grad, d * t
                ys = float(y @ s)
                if ys > 1e-10:  # curvature: keep the pair
                    if len(old_dirs) == group["history_size"]:
                        old_dirs.pop(0), old_stps.pop(0), ro.pop(0)
                    old_dirs.append(y), old_stps.append(s), ro.append(1.0 / ys)
                    h_diag = ys / float(y @ y)
                d = _two_loop(-grad, old_dirs, old_stps, ro, h_diag)
            prev_grad, prev_loss = grad.copy(), loss
            t = min(1.0, 1.0 / float(xp.abs(grad).sum())) * lr if state["n_iter"] == 1 else lr
            gtd = float(grad @ d)
            if gtd > -tol_change:  # not a descent direction
                break
            trials = 0
            if group["line_search_fn"] is not None:
                start = [p.array.copy() for p in self._params]
                loss, grad, t, trials = _strong_wolfe(
                    lambda step, start=start, d=d: self._evaluate(closure, start, step, d),
                    t, d, loss, grad, gtd)
                self._add(t, d)
                optimal = float(xp.abs(grad).max()) <= tol_grad
            else:
                self._add(t, d)
                optimal = False
                if n_iter != max_iter:  # the last iteration's loss is the next step's
                    with enable_grad():
                        loss = float(closure())
                    grad = self._flat_grad()
                    optimal = float(xp.abs(grad).max()) <= tol_grad
                    trials = 1
            evals += trials
            state["func_evals"] += trials
            if n_iter == max_iter or evals >= max_eval or optimal:
                break
            if float(xp.abs(d * t).max()) <= tol_change or abs(loss - prev_loss) < tol_change:
                break
        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=h_diag,
                     prev_flat_grad=prev_grad, prev_loss=prev_loss)
        return first_loss


def _as_list(where, value):
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{where} must be a list, got {type(value).__name__}")
    return list(value)


def _scalar(where, value):
    """A Python number from a number or a 0-d array (PyTorch saves 0-d tensors)."""
    if hasattr(value, "shape"):
        if np.ndim(value) != 0:
            raise ValueError(f"{where} must be a scalar, got shape {tuple(np.shape(value))}")
        return asnumpy(value).item()
    if not isinstance(value, (int, float)):
        raise TypeError(f"{where} must be a number, got {type(value).__name__}")
    return value


def _two_loop(q, dirs, steps, ro, h_diag):
    """H·q for the L-BFGS inverse Hessian of the pairs (steps, dirs)."""
    alphas = []
    for y, s, r in zip(reversed(dirs), reversed(steps), reversed(ro)):
        a = float(s @ q) * r
        q = q - a * y
        alphas.append(a)
    out = q * h_diag
    for (y, s, r), a in zip(zip(dirs, steps, ro), reversed(alphas)):
        out = out + (a - float(y @ out) * r) * s
    return out


def _cubic_min(x1, f1, g1, x2, f2, g2, bounds=None):
    """The minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2),
    clipped to ``bounds`` (default: between x1 and x2); their midpoint when
    the cubic has no minimum."""
    lo, hi = bounds if bounds is not None else (min(x1, x2), max(x1, x2))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    disc = d1 * d1 - g1 * g2
    if disc < 0:
        return (lo + hi) / 2.0
    d2 = disc ** 0.5
    if x1 <= x2:
        at = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        at = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(at, lo), hi)


def _strong_wolfe(evaluate, t, d, f, g, gtd, c1=1e-4, c2=0.9, tol_change=1e-9, max_ls=25):
    """(loss, gradient, step, evaluations) of a step along d meeting the
    strong Wolfe conditions, from (f, g, gtd) at step 0 and a first trial t."""
    xp = xp_of(d)
    d_norm = float(xp.abs(d).max())
    f_new, g_new = evaluate(t)
    evals, gtd_new = 1, float(g_new @ d)
    t_prev, f_prev, g_prev, gtd_prev = 0.0, f, g, gtd
    done, trial = False, 0
    bracket = None
    while trial < max_ls:  # grow the step until a bracket holds a Wolfe point
        if f_new > f + c1 * t * gtd or (trial > 1 and f_new >= f_prev):
            bracket = [[t_prev, f_prev, g_prev, gtd_prev], [t, f_new, g_new, gtd_new]]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, done = [[t, f_new, g_new, gtd_new]], True
            break
        if gtd_new >= 0:  # past a minimum: it lies between the last two trials
            bracket = [[t_prev, f_prev, g_prev, gtd_prev], [t, f_new, g_new, gtd_new]]
            break
        t_next = _cubic_min(t_prev, f_prev, gtd_prev, t, f_new, gtd_new,
                            bounds=(t + 0.01 * (t - t_prev), t * 10))
        t_prev, f_prev, g_prev, gtd_prev = t, f_new, g_new, gtd_new
        t = t_next
        f_new, g_new = evaluate(t)
        evals, gtd_new, trial = evals + 1, float(g_new @ d), trial + 1
    if trial == max_ls:
        bracket = [[0.0, f, g, None], [t, f_new, g_new, None]]
    low, high = (0, 1) if bracket[0][1] <= bracket[-1][1] else (1, 0)
    stalled = False
    while not done and trial < max_ls:  # zoom
        (a, fa, _, ga), (b, fb, _, gb) = bracket
        if abs(b - a) * d_norm < tol_change:
            break
        t = _cubic_min(a, fa, ga, b, fb, gb)
        top, bottom = max(a, b), min(a, b)
        eps = 0.1 * (top - bottom)
        if min(top - t, t - bottom) < eps:  # too close to an end
            if stalled or t >= top or t <= bottom:
                t = top - eps if abs(t - top) < abs(t - bottom) else bottom + eps
                stalled = False
            else:
                stalled = True
        else:
            stalled = False
        f_new, g_new = evaluate(t)
        evals, gtd_new, trial = evals + 1, float(g_new @ d), trial + 1
        if f_new > f + c1 * t * gtd or f_new >= bracket[low][1]:
            bracket[high] = [t, f_new, g_new, gtd_new]
            low, high = (0, 1) if bracket[0][1] <= bracket[1][1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high][0] - bracket[low][0]) >= 0:
                bracket[high] = bracket[low]
            bracket[low] = [t, f_new, g_new, gtd_new]
    t, f_new, g_new, _ = bracket[low]
    return f_new, g_new, t, evals
