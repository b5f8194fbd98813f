"""Runs of parameters stored back to back: one update call per run.

When the parameters live in one flat array (``ParamAndGradBuffer`` with
``flat_params=True``, ZeRO's shards, any array a user carved into views)
and so do their gradients (the buffer's persistent ``grad_flats``), a run
of consecutive parameters of a group is one contiguous range of each flat
array. An elementwise update (every optimizer here) applied to the range
once gives the same bits as applied to each parameter: the same operations
on the same elements in the same order. So a run steps as one call of the
optimizer's ``update(data, grad, state, *args)`` (one fused kernel on the
CPU, one elementwise kernel per operation on the GPU) instead of one per
parameter.

The per-parameter state stays per parameter (``optimizer.state[p]``, and
so ``state_dict()``): a run's state arrays are flat arrays too, and each
parameter's entry is its view of them. Scalar state (``step``) must be
equal across a run and is written back to every parameter after the call.

Detection is cached per group and checked each step by identity: every
parameter's array and gradient array, every state dict and its arrays.
Anything else (a ``.grad`` of None or not a view, an array replaced by
``p.data = t``, states that differ, a loaded checkpoint) changes the runs
or falls back to per-parameter calls, so the numbers never depend on it.
"""
from ..backend import data_address, xp_of


def _flat_place(a):
    """(base, offset) when ``a`` is a C-contiguous, non-empty view of a 1-D
    C-contiguous array of the same type and dtype; else None."""
    base = getattr(a, "base", None)
    if (base is None or type(base) is not type(a) or base.ndim != 1 or a.size == 0
            or base.dtype != a.dtype or not a.flags.c_contiguous
            or not base.flags.c_contiguous):
        return None
    offset, rest = divmod(data_address(a) - data_address(base), a.itemsize)
    if rest or offset < 0 or offset + a.size > base.size:
        return None
    return base, offset


class _Run:
    """Consecutive parameters ``[start, stop)`` of a group whose arrays are
    ``pbase[poff:poff + numel]`` and gradients ``gbase[goff:goff + numel]``."""

    def __init__(self, start, p_place, g_place, p):
        self.start = self.stop = start
        (self.pbase, self.poff), (self.gbase, self.goff) = p_place, g_place
        self.sizes, self.shapes, self.numel = [], [], 0
        self.parts = {}  # (i, j) -> _Part: the state of the sub-run [i, j)
        self.add(p)

    def extends(self, p_place, g_place):
        return (p_place[0] is self.pbase and p_place[1] == self.poff + self.numel
                and g_place[0] is self.gbase and g_place[1] == self.goff + self.numel)

    def add(self, p):
        self.stop += 1
        self.sizes.append(p.array.size)
        self.shapes.append(p.array.shape)
        self.numel += p.array.size


def _runs(params):
    """The runs of ``params`` (those without a gradient stand outside any)."""
    runs, run = [], None
    for i, p in enumerate(params):
        if p.grad is None:
            run = None
            continue
        p_place, g_place = _flat_place(p.array), _flat_place(p.grad.array)
        if p_place is None or g_place is None or p.grad.array.shape != p.array.shape:
            run = None
        elif run is not None and run.stop == i and run.extends(p_place, g_place):
            run.add(p)
        else:
            run = _Run(i, p_place, g_place, p)
            runs.append(run)
    return [r for r in runs if r.stop - r.start > 1]


def _is_array(value):
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _signature(state, shape):
    """What must agree for parameters to share one update call: the public
    keys, the scalar values (and types), each array's dtype; None when an
    array is not shaped like its parameter (it steps alone)."""
    sig = []
    for k in sorted(k for k in state if not k.startswith("_")):
        v = state[k]
        if _is_array(v):
            if tuple(v.shape) != tuple(shape):
                return None
            sig.append((k, "array", v.dtype, type(v)))
        else:
            sig.append((k, type(v), v))
    return tuple(sig)


class _Part:
    """The state of one sub-run: flat arrays per key (each parameter's entry a
    view), the scalars last written, the private scratch of the update."""

    def __init__(self):
        self.flats, self.views, self.scalars, self.private = {}, {}, {}, {}
        self.states, self.lengths = [], []

    def valid(self, states):
        """Whether ``states`` are exactly what this part wrote last."""
        if len(states) != len(self.states):
            return False
        for st, old, n in zip(states, self.states, self.lengths):
            if st is not old or len(st) != n:
                return False
        for k, views in self.views.items():
            for st, view in zip(states, views):
                if st.get(k) is not view:
                    return False
        for k, v in self.scalars.items():
            for st in states:
                w = st.get(k)
                if w is not v and (type(w) is not type(v) or w != v):
                    return False
        return True

    def adopt(self, states, sizes, shapes):
        """Take over ``states`` (agreeing ones): their arrays become views of
        one flat array per key, reused where they already are adjacent views."""
        self.flats, self.views, self.scalars = {}, {}, {}
        for k, v in states[0].items():
            if k.startswith("_"):
                continue
            if _is_array(v):
                arrays = [st[k] for st in states]
                flat = _adjacent(arrays)
                if flat is None:
                    flat = _gather(arrays, sum(sizes))
                    self._split(k, flat, states, sizes, shapes)
                else:
                    self.flats[k], self.views[k] = flat, arrays
            else:
                self.scalars[k] = v
        self._remember(states)

    def write_back(self, run_state, states, sizes, shapes):
        """After the update: new or replaced arrays are split into views,
        scalars copied to every parameter, removed keys removed."""
        for k, v in run_state.items():
            if k.startswith("_"):
                self.private[k] = v
            elif _is_array(v):
                if self.flats.get(k) is not v:
                    if v.ndim != 1 or v.size != sum(sizes):
                        raise RuntimeError(
                            f"optimizer state '{k}' of a run of {len(sizes)} parameters has "
                            f"shape {tuple(v.shape)}, expected ({sum(sizes)},)")
                    self._split(k, v, states, sizes, shapes)
            else:
                self.scalars[k] = v
                for st in states:
                    st[k] = v
        for k in [k for k in (*self.flats, *self.scalars) if k not in run_state]:
            self.flats.pop(k, None)
            self.views.pop(k, None)
            self.scalars.pop(k, None)
            for st in states:
                st.pop(k, None)
        self._remember(states)

    def run_state(self):
        return {**self.scalars, **self.flats, **self.private}

    def _split(self, k, flat, states, sizes, shapes):
        views, offset = [], 0
        for st, n, shape in zip(states, sizes, shapes):
            st[k] = view = flat[offset:offset + n].reshape(shape)
            views.append(view)
            offset += n
        self.flats[k], self.views[k] = flat, views

    def _remember(self, states):
        self.states, self.lengths = list(states), [len(st) for st in states]


def _adjacent(arrays):
    """The flat range the arrays are adjacent views of, in order, or None."""
    first = _flat_place(arrays[0])
    if first is None:
        return None
    base, start = first
    end = start
    for a in arrays:
        place = _flat_place(a)
        if place is None or place[0] is not base or place[1] != end:
            return None
        end += a.size
    return base[start:end]


def _gather(arrays, numel):
    flat = xp_of(arrays[0]).empty(numel, dtype=arrays[0].dtype)
    offset = 0
    for a in arrays:
        flat[offset:offset + a.size] = a.reshape(-1)
        offset += a.size
    return flat


class FlatRuns:
    """Per optimizer: the runs of each group, recomputed when an array changes."""

    def __init__(self):
        self._groups = {}  # id(group) -> (group, key objects, runs)

    def runs(self, group):
        params = group["params"]
        cached = self._groups.get(id(group))
        if cached is not None and cached[0] is group and len(cached[1]) == len(params):
            for p, (a, g) in zip(params, cached[1]):
                grad = p.grad
                if p.array is not a or (None if grad is None else grad.array) is not g:
                    break
            else:
                return cached[2]
        key = [(p.array, None if p.grad is None else p.grad.array) for p in params]
        runs = _runs(params)
        # the cache holds the arrays, so their identities cannot be reused
        self._groups[id(group)] = (group, key, runs)
        return runs


def step_group(optimizer, group, update, args):
    """``update(data, grad, state, *args)`` on every parameter of ``group``
    that has a gradient: once per run, once per parameter elsewhere."""
    params, state = group["params"], optimizer.state
    runs = optimizer._flat_runs.runs(group)
    i = 0
    for run in runs:
        for p in params[i:run.start]:
            if p.grad is not None:
                update(p.array, p.grad.array, state.setdefault(p, {}), *args)
        _step_run(run, params, state, update, args)
        i = run.stop
    for p in params[i:]:
        if p.grad is not None:
            update(p.array, p.grad.array, state.setdefault(p, {}), *args)


def _step_run(run, params, state, update, args):
    run_params = params[run.start:run.stop]
    states = [state.setdefault(p, {}) for p in run_params]
    whole = (0, len(states))
    part = run.parts.get(whole)
    if part is not None and part.valid(states):
        _step_part(run, whole, part, run_params, states, update, args)
        return
    sigs = [_signature(st, shape) for st, shape in zip(states, run.shapes)]
    parts, i = {}, 0
    while i < len(states):
        j = i + 1
        while j < len(states) and sigs[i] is not None and sigs[j] == sigs[i]:
            j += 1
        if j - i == 1:
            p = run_params[i]
            update(p.array, p.grad.array, states[i], *args)
        else:
            part = run.parts.get((i, j))
            if part is None or not part.valid(states[i:j]):
                part = part or _Part()
                part.adopt(states[i:j], run.sizes[i:j], run.shapes[i:j])
            _step_part(run, (i, j), part, run_params[i:j], states[i:j], update, args)
            parts[(i, j)] = part
        i = j
    run.parts = parts


def _step_part(run, span, part, run_params, states, update, args):
    i, j = span
    lo = sum(run.sizes[:i])
    hi = lo + sum(run.sizes[i:j])
    run_state = part.run_state()
    update(run.pbase[run.poff + lo:run.poff + hi], run.gbase[run.goff + lo:run.goff + hi],
           run_state, *args)
    part.write_back(run_state, states, run.sizes[i:j], run.shapes[i:j])
