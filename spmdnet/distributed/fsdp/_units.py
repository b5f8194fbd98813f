"""Shard units of ``FullyShardedDataParallel``: gather, run, recompute.

A ``Unit`` is a module whose parameters form their own flats
(``_flat_param.Flat``; the wrap policy), or the root. A unit's output that
is a view of its gathered parameters is copied before they are freed.
Wrapped units run through ``UnitRun``, one autograd
``Function`` per call: its forward gathers, runs the module without
recording a graph (no op can save a full parameter) and frees; its backward
gathers again, re-runs the module's forward with a graph (activation
recomputation, restoring the RNG state and the module's buffers, so dropout
masks and running statistics are those of the first run), backpropagates the
output gradient (the unit's full backward hooks fire there, see
``_recompute``; into the gradient buckets of the wrapper's
``ParamAndGradBuffer``, one per flat), tells the wrapper the unit's
gradients are final (``unit_done``: their reduce-scatter starts and travels
while the previous unit recomputes) and frees.

Every rank runs every wrapped unit's backward, in the reverse order of the
forward, whatever reaches its loss: each ``UnitRun`` of a training forward
takes the previous unit's output as one more input (a "link", whose
gradient is zeros) and ``ChainEnd`` links the last one to the model's
output. A unit whose output reaches the loss on some ranks only then
gathers and reduce-scatters (zeros) on the others too, instead of leaving
them in another collective (a deadlock).
"""
from ... import random as sn_random
from ..._tensor import Tensor
from ...autograd import Function, enable_grad
from ...backend import xp_of
from ...nn.modules._backward import BackwardHook
from ...nn.modules._hooks import backward_hooks_of


class Unit:
    """A module whose own parameters (not those of nested units) form flats."""

    def __init__(self, name, module, flats, recompute):
        self.name, self.module, self.flats, self.recompute = name, module, flats, recompute
        self.forward = type(module).forward.__get__(module)

    def gather(self):
        for f in self.flats:
            f.gather()

    def free(self):
        for f in self.flats:
            f.free()

    def own(self, array):
        """``array``, or a copy when it is a view of the gathered parameters
        (which go back to the pool when freed)."""
        xp = xp_of(array)
        if any(f.full is not None and xp.may_share_memory(array, f.full) for f in self.flats):
            return array.copy()
        return array


def _buffers_snapshot(module):
    return [(b, b.array.copy()) for b in module.buffers()]


def _zeros_like(xp, specs):
    return tuple(xp.zeros(shape, dtype) for shape, dtype in specs)


def _recompute(unit, xs, kwargs):
    """The unit's forward on ``xs`` with a graph, its forward hooks not run
    again (they ran in the real forward) and its full backward hooks gated
    as in a module call (``BackwardHook``), so the backward of this graph
    gives them the unit's true ``grad_output`` and ``grad_input``."""
    hooks, pre_hooks = backward_hooks_of(unit.module)
    if not (hooks or pre_hooks):
        return unit.forward(*xs, **kwargs)
    gates = BackwardHook(unit.module, hooks, pre_hooks)
    out = unit.forward(*gates.setup_input_hook(tuple(xs)), **kwargs)
    return gates.setup_output_hook(out)


class ChainEnd(Function):
    """The model's output, linked to the last unit's output (``links``):
    identity forward; backward calls ``on_backward`` (the end-of-backward
    reduction is scheduled) and hands the links zero gradients, so that
    every unit's backward runs on every rank."""

    def forward(self, x, *links, on_backward=None):
        self.on_backward = on_backward
        self.links = [(a.shape, a.dtype) for a in links]
        return x

    def backward(self, g):
        self.on_backward()
        return (g,) + _zeros_like(xp_of(g), self.links)


class UnitRun(Function):
    """A wrapped unit's call in the graph: its forward already ran without a
    graph (``module_hooks``; ``result`` its output, ``rng`` the RNG state it
    started from), backward by recomputation. The last ``n_links`` inputs
    are links (see the module docstring): not passed to the unit, zero
    gradients."""

    def forward(self, *arrays, unit=None, n_shards=0, n_links=0, kwargs=None, owner=None,
                result=None, rng=None):
        self.unit, self.kwargs, self.owner = unit, kwargs or {}, owner
        end = len(arrays) - n_links
        self.inputs = arrays[n_shards:end]
        self.links = [(a.shape, a.dtype) for a in arrays[end:]]
        self.rng = rng
        return result

    def backward(self, g):
        unit, owner = self.unit, self.owner
        n = len(unit.flats)
        needs = self.needs_input_grad[n:n + len(self.inputs)]
        kept_rng, buffers = sn_random.get_rng_state(), _buffers_snapshot(unit.module)
        unit.gather()
        owner.open_grads(unit)
        try:
            sn_random.set_rng_state(self.rng)
            xs = [Tensor(x, requires_grad=need) for x, need in zip(self.inputs, needs)]
            with enable_grad():
                out = _recompute(unit, xs, self.kwargs)
            owner.poke()
            if out.requires_grad:
                out.backward(g)
        finally:
            sn_random.set_rng_state(kept_rng)
            for b, saved in buffers:
                b.array[...] = saved
        owner.unit_done(unit)
        unit.free()
        owner.unit_freed(unit)
        owner.poke()
        xgrads = tuple(None if x.grad is None else x.grad.array for x in xs)
        return (None,) * n + xgrads + _zeros_like(xp_of(g), self.links)
