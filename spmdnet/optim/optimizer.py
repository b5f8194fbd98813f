"""The Optimizer base class: parameter groups, per-parameter state, and
checkpointing in PyTorch's ``state_dict`` layout.

Optimizers work on raw arrays (``p.array``, ``p.grad.array``), never on
Tensors, so no autograd graph is recorded and no ``no_grad`` is needed. They update
``p.array`` strictly in place: other objects (flat gradient buckets, views
made by data-parallel wrappers) alias those buffers and must stay valid.
Each optimizer's update is one elementwise function of (data, grad,
state); ``_step_group`` calls it once per run of parameters stored back to
back in flat arrays (``_flat_runs``), once per parameter elsewhere.
"""
import numpy as np

from ..backend import asnumpy, xp_of
from ._flat_runs import FlatRuns, step_group

_SCRATCH = "_scratch"  # private state key: never saved, rebuilt on demand


def _is_param(obj):
    """Duck-typed parameter test: anything with ``data`` and ``grad``."""
    return hasattr(obj, "data") and hasattr(obj, "grad")


def check_nonneg(name, value):
    """Raise ValueError showing the value unless ``value >= 0``.

    Written as ``not value >= 0`` so NaN is rejected too.
    """
    if not value >= 0.0:
        raise ValueError(f"Invalid {name}: {value}")


def implementation_flags(name, foreach=None, differentiable=False, **optional):
    """PyTorch's implementation switches as param-group entries, checked.

    ``foreach`` and ``fused`` pick one of PyTorch's implementations of the
    same update; here there is one (fused kernels where ``kernels.lookup``
    gives them, else in-place xp), so they are accepted and recorded and
    change no number. ``differentiable`` (an update autograd can go through)
    and ``capturable`` (CUDA graphs) have no equivalent: True raises.
    ``optional`` holds ``fused`` and ``capturable`` for the optimizers that
    take them in PyTorch, so each records the keys PyTorch records.
    """
    if foreach and optional.get("fused"):
        raise RuntimeError(f"{name}: `fused` and `foreach` cannot be `True` together.")
    flags = {"foreach": foreach, "differentiable": differentiable, **optional}
    for flag, why in (("differentiable", "an update that autograd can differentiate"),
                      ("capturable", "CUDA-graph capture of the step")):
        if flags.get(flag):
            raise NotImplementedError(
                f"{name}({flag}=True): spmdnet has no {why}; optimizers update raw arrays "
                f"outside autograd. Leave {flag}=False.")
    return flags


def signed_grad(grad, maximize):
    """The gradient to descend: ``-grad`` (a new array) to maximize."""
    return -grad if maximize else grad


def check_betas(betas):
    """``betas`` as a pair of floats in [0, 1), or ValueError showing them."""
    betas = tuple(betas)
    if len(betas) != 2:
        raise ValueError(f"betas must be a pair, got {betas}")
    for i, b in enumerate(betas):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {b}")
    return betas


def decayed_grad(data, grad, group):
    """The gradient an update descends, from ``group``'s ``maximize`` and
    ``weight_decay``: L2 decay is added to it (a new array; ``p.grad`` is
    untouched); with ``decoupled_weight_decay`` the parameter shrinks by
    ``1 - lr * weight_decay`` in place instead."""
    g = signed_grad(grad, group.get("maximize", False))
    wd = float(group["weight_decay"])
    if wd != 0.0:
        if group.get("decoupled_weight_decay", False):
            data *= 1.0 - float(group["lr"]) * wd
        else:
            g = g + wd * data
    return g


def scratch(state, data):
    """A scratch array like ``data``, allocated once and kept in ``state``.

    Updates write their temporaries here through ``out=`` so that a step
    allocates nothing after the first one.
    """
    buf = state.get(_SCRATCH)
    if buf is None:
        buf = state[_SCRATCH] = xp_of(data).empty_like(data)
    return buf


def _write_into(old, new):
    """Loaded arrays go into the state arrays they replace where those fit
    (same type, shape, dtype): state laid out as views of flat arrays (a
    run's, see ``_flat_runs``) stays so."""
    for k, v in new.items():
        w = old.get(k)
        if (hasattr(v, "shape") and hasattr(w, "shape") and type(v) is type(w)
                and v.shape == w.shape and v.dtype == w.dtype and v is not w):
            w[...] = v
            new[k] = w


class Optimizer:
    """Base class holding ``param_groups`` and ``state`` like PyTorch's.

    ``params`` is an iterable of parameters, or of dicts ``{"params": [...],
    **hyperparameters}``; missing hyperparameters come from ``defaults``.
    ``state`` maps each parameter (hashed by identity) to a dict.
    Subclasses implement ``step`` and may override ``_validate(group)``.
    """

    def __init__(self, params, defaults):
        if _is_param(params):
            raise TypeError("params must be an iterable of parameters or of "
                            "dicts, got a single parameter")
        self.defaults = dict(defaults)
        self._validate(self.defaults)
        self.state = {}
        self.param_groups = []
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def _validate(self, group):
        """Raise ValueError for an invalid hyperparameter in ``group``."""

    def add_param_group(self, group):
        """Add a group; its unset hyperparameters take the defaults."""
        if not isinstance(group, dict):
            raise TypeError(f"a param group must be a dict, got {type(group).__name__}")
        params = group["params"]
        params = [params] if _is_param(params) else list(params)
        for p in params:
            if not _is_param(p):
                raise TypeError(f"optimizer can only optimize parameters, got "
                                f"{type(p).__name__}")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in params}) != len(params) or \
                any(id(p) in seen for p in params):
            raise ValueError("a parameter appears more than once in the optimizer")
        group = {**self.defaults, **group, "params": params}
        self._validate(group)
        self.param_groups.append(group)

    def zero_grad(self, set_to_none=True):
        """Drop gradients (``set_to_none=True``) or zero them in place.

        Zeroing in place keeps gradient buffers that others alias (e.g. a
        flat all-reduce bucket) alive; dropping them frees the memory.
        """
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def step(self, closure=None):
        """Apply one update to every parameter that has a gradient."""
        raise NotImplementedError

    def _step_group(self, group, update, *args):
        """``update(data, grad, state, *args)`` on each parameter of ``group``
        with a gradient; parameters stored back to back in flat arrays step as
        one call per run (``_flat_runs``; the same numbers, elementwise)."""
        if "_flat_runs" not in self.__dict__:  # also after unpickling
            self._flat_runs = FlatRuns()
        step_group(self, group, update, args)

    def __getstate__(self):
        # the run cache describes this optimizer's storage; a copy rebuilds its own
        return {k: v for k, v in self.__dict__.items() if k != "_flat_runs"}

    def _indexed_params(self):
        """Parameters in group order: their position is the checkpoint index."""
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self):
        """A checkpoint in PyTorch's layout; arrays are host NumPy copies.

        Parameters are named by their index across groups, so the
        checkpoint can be loaded into an optimizer over new parameter
        objects built in the same order.
        """
        index = {id(p): i for i, p in enumerate(self._indexed_params())}
        state = {}
        for p, st in self.state.items():
            state[index[id(p)]] = {k: self._save_state_value(k, v)
                                   for k, v in st.items() if not k.startswith("_")}
        groups, start = [], 0
        for g in self.param_groups:
            n = len(g["params"])
            groups.append({**{k: v for k, v in g.items() if k != "params"},
                           "params": list(range(start, start + n))})
            start += n
        return {"state": state, "param_groups": groups}

    def _save_state_value(self, key, value):
        """One state entry as saved: arrays become host NumPy copies.
        Optimizers whose state holds containers of arrays override this."""
        return np.array(asnumpy(value), copy=True) if hasattr(value, "shape") else value

    def _load_state_value(self, idx, p, key, value):
        """One saved state entry, checked and placed for parameter ``p``
        (index ``idx``): an array must have ``p``'s shape and becomes a copy
        in ``p``'s dtype on ``p``'s device; a 0-d array becomes a Python
        scalar. Optimizers whose state is not shaped like each parameter
        override this with their own checks."""
        if hasattr(value, "shape") and np.ndim(value) > 0:
            if tuple(value.shape) != tuple(p.array.shape):
                raise ValueError(
                    f"state '{key}' of parameter {idx} has shape {tuple(value.shape)}, "
                    f"the parameter has shape {tuple(p.array.shape)}")
            return xp_of(p.array).array(value, dtype=p.array.dtype)
        if isinstance(value, np.ndarray):
            return value.item()
        return value

    def load_state_dict(self, state_dict):
        """Restore a ``state_dict()``; everything is checked before anything
        changes, so a bad checkpoint leaves the optimizer untouched."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"loaded state dict has {len(saved_groups)} parameter groups, "
                f"the optimizer has {len(self.param_groups)}")
        for i, (g, sg) in enumerate(zip(self.param_groups, saved_groups)):
            if len(g["params"]) != len(sg["params"]):
                raise ValueError(
                    f"parameter group {i} has {len(g['params'])} parameters, "
                    f"the loaded state dict has {len(sg['params'])}")
        params = self._indexed_params()
        new_state = {}
        for idx, st in state_dict["state"].items():
            idx = int(idx)
            if not 0 <= idx < len(params):
                raise ValueError(f"state for unknown parameter index {idx}")
            p = params[idx]
            new_state[p] = {k: self._load_state_value(idx, p, k, v) for k, v in st.items()}
        for p, st in new_state.items():
            _write_into(self.state.get(p, {}), st)
        for g, sg in zip(self.param_groups, saved_groups):
            g.update({k: v for k, v in sg.items() if k != "params"})
        self.state = new_state

    def __repr__(self):
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            hp = ", ".join(f"{k}={v}" for k, v in g.items() if k != "params")
            lines.append(f"  group {i}: {len(g['params'])} params, {hp}")
        return "\n".join(lines + [")"])
