"""Shard units of ``FullyShardedDataParallel``: flat shards, gather, recompute.

A ``Flat`` holds some parameters of one unit as ONE flat shard per rank: the
parameters raveled one after the other, zero-padded to a multiple of the
group size N, this rank's 1/N slice kept as a ``Parameter`` (what the
optimizer updates). Between uses the original parameters hold zero-size
arrays; ``gather`` all-gathers the shard into a full array and points each
parameter's ``.array`` at its view; ``free`` drops it again. Full arrays
come from a ``Pool`` and go back to it when freed (the gradient buckets'
storage too, see ``fully_sharded``): a step reuses the same few buffers
instead of allocating (and page-faulting) new ones. A unit's output that is
a view of its gathered parameters is copied before they are freed.

A ``Unit`` is a module whose parameters form their own flats (the wrap
policy), or the root. Wrapped units run through ``UnitRun``, one autograd
``Function`` per call: its forward gathers, runs the module without
recording a graph (no op can save a full parameter) and frees; its backward
gathers again, re-runs the module's forward with a graph (activation
recomputation, restoring the RNG state and the module's buffers, so dropout
masks and running statistics are those of the first run), backpropagates the
output gradient (into the gradient buckets of the wrapper's
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
import time

from ... import distributed as dist
from ... import random as sn_random
from ..._owned_storage import claim
from ..._tensor import Tensor
from ...autograd import Function, enable_grad
from ...backend import is_cupy_array, xp_of
from ...distributed.bucket_collectives import BucketComm
from ...nn import Parameter
from .._common.flat import FlatLayout


class Pool:
    """Free flat buffers by (array module, length, dtype), reused by ``take``."""

    def __init__(self):
        self.stacks = {}

    @staticmethod
    def _key(xp, n, dtype):
        return xp.__name__, int(n), str(dtype)

    def take(self, xp, n, dtype):
        stack = self.stacks.get(self._key(xp, n, dtype))
        return stack.pop() if stack else xp.empty(n, dtype)

    def give(self, buf):
        self.stacks.setdefault(self._key(xp_of(buf), buf.size, buf.dtype), []).append(buf)

    def nbytes(self):
        return sum(b.nbytes for stack in self.stacks.values() for b in stack)

    def clear(self):
        self.stacks.clear()


class Flat:
    """One flat shard: ``params`` (with ``names``) of one dtype, in order,
    laid out by a ``FlatLayout`` padded to the group size; this rank's slice
    is the ``shard`` Parameter. ``options``: the optimizer options of its
    parameters (its parameter group); ``source``: the ``Prefetcher`` that
    gathers it (None: blocking gathers); ``pool``: the ``Pool`` of its full
    buffers (None: new ones)."""

    def __init__(self, names, params, comm, options=None, source=None, pool=None):
        self.names, self.params, self.comm = names, params, comm
        self.bc = BucketComm(comm, "none")  # blocking gathers of this flat's parameters
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        self.layout = FlatLayout([p.shape for p in params], parts=self.size)
        first = params[0].array
        self.xp, self.dtype = xp_of(first), first.dtype
        full = self.layout.pack(self.xp.zeros(self.layout.padded_numel, self.dtype),
                                [p.array for p in params])
        self.shard = Parameter(self.layout.shard_of(full, self.rank).copy())
        for name, p in zip(names, params):  # p.data = t would escape gather/free
            claim(p, f"parameter {name!r} of FullyShardedDataParallel")
        self.options = dict(options or {})
        self.source, self.pool = source, pool
        self.full = None  # the gathered full array while the parameters view it
        self.free()

    @property
    def numel(self):
        return self.layout.numel

    @property
    def shapes(self):
        return self.layout.shapes

    def take(self):
        """An uninitialised full-length flat buffer (from the pool when set)."""
        n = self.layout.padded_numel
        return self.pool.take(self.xp, n, self.dtype) if self.pool else self.xp.empty(n, self.dtype)

    def give(self, buf):
        if self.pool is not None:
            self.pool.give(buf)

    # -- parameters ------------------------------------------------------------------
    def allgather(self, shard=None):
        """A new full (padded) flat array: every rank's shard (or ``shard``, an
        array of the shard's shape such as an optimizer state), in rank order."""
        shard = self.shard.array if shard is None else shard
        if self.size == 1:
            return shard.copy()
        return dist.allgather(shard, comm=self.comm).reshape(-1)

    def gather_params(self):
        """(The full flat parameters, all-gathered (blocking) into a pooled
        buffer; the seconds it took)."""
        if is_cupy_array(self.shard.array):
            t0 = time.perf_counter()
            return self.allgather(), time.perf_counter() - t0
        buf = self.take()
        if self.size == 1:
            buf[...] = self.shard.array
            return buf, 0.0
        return buf, self.bc.all_gather(self.shard.array, buf, "allgather(FSDP parameters)").wait()

    def gather(self):
        """All-gather the shard (through ``source``, the prefetcher, when set);
        point every parameter at its view. Returns the full array."""
        full = self.source.fetch(self) if self.source is not None else self.gather_params()[0]
        self.view(full)
        return full

    @property
    def live(self):
        """Whether the full parameters are gathered (the parameters view ``full``)."""
        return self.full is not None

    def view(self, full):
        self.full = full
        for p, view in zip(self.params, self.layout.views(full)):
            p.array = view

    def free(self):
        """Full parameters and gradients dropped: zero-size arrays remain
        (their gradients are in the gradient buckets by now)."""
        if self.full is not None:
            self.give(self.full)
            self.full = None
        for p in self.params:
            p.array = self.xp.empty(0, self.dtype)
            p.grad = None

    def load_full(self, full):
        """Keep this rank's slice of a full flat array as the shard."""
        self.shard.array[...] = self.layout.shard_of(full, self.rank)


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
                out = unit.forward(*xs, **self.kwargs)
            owner.poke()
            if out.requires_grad:
                out.backward(g)
        finally:
            sn_random.set_rng_state(kept_rng)
            for b, saved in buffers:
                b.array[...] = saved
        owner.unit_done(unit)
        unit.free()
        owner.poke()
        xgrads = tuple(None if x.grad is None else x.grad.array for x in xs)
        return (None,) * n + xgrads + _zeros_like(xp_of(g), self.links)
