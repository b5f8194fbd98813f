"""Flat shards of ``FullyShardedDataParallel``'s parameters (PyTorch's
``FlatParameter``), and the split of a unit's parameters into them.

A ``Flat`` holds some parameters of one unit as ONE flat shard per rank: the
parameters raveled one after the other, zero-padded to a multiple of the
group size N, this rank's 1/N slice kept as a ``Parameter`` (what the
optimizer updates). Between uses the original parameters hold zero-size
arrays; ``gather`` all-gathers the shard into a full array and points each
parameter's ``.array`` at its view; ``free`` drops it again. Full arrays
come from a ``Pool`` and go back to it when freed (the gradient buckets'
storage too, see ``fully_sharded_data_parallel``): a step reuses the same
few buffers instead of allocating (and page-faulting) new ones.

``split_flats`` makes one ``Flat`` per dtype and distinct options dict among
a unit's parameters (the ``param_groups`` function), so minGPT's groups
(decay on the matrices, none on biases and LayerNorm) are separate shards,
each padded to the group size. ``optimizer_groups`` builds the optimizer's
``[{"params": shards, **options}]``.
"""
import time

import numpy as np

from ... import distributed as dist
from ..._owned_storage import claim
from ...backend import asnumpy, is_cupy_array, upload, xp_of
from ..._tensor import Tensor
from ...nn import Parameter
from ...parallel._common.flat import FlatLayout
from ..bucket_collectives import BucketComm


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

    def __init__(self, names, params, comm, options=None, source=None, pool=None,
                 offload=False, param_dtype=None):
        self.names, self.params, self.comm = names, params, comm
        self.bc = BucketComm(comm, "none")  # blocking gathers of this flat's parameters
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        self.layout = FlatLayout([p.shape for p in params], parts=self.size)
        first = params[0].array
        self.xp, self.dtype = xp_of(first), first.dtype
        # mixed precision: the gathered parameters' dtype (the shard keeps self.dtype)
        self.param_dtype = self.dtype if param_dtype is None else np.dtype(param_dtype)
        self.offload = offload  # the shard (and its gradient) on the host
        full = self.layout.pack(self.xp.zeros(self.layout.padded_numel, self.dtype),
                                [p.array for p in params])
        shard = self.layout.shard_of(full, self.rank).copy()
        self.shard = Parameter(asnumpy(shard) if offload else shard)
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

    @property
    def prefetchable(self):
        """Whether a non-blocking gather lands straight in a ``take`` buffer
        (host arrays: no device copy after it)."""
        return self.xp is np and not is_cupy_array(self.shard.array)

    def send(self, exact=False):
        """The array this rank all-gathers: its shard, cast to the
        parameters' compute dtype (``exact``: the shard's own), as ``wire``."""
        shard = self.shard.array
        return wire(shard if exact or shard.dtype == self.param_dtype else
                    shard.astype(self.param_dtype))

    def take(self, exact=False):
        """An uninitialised full-length flat buffer of the compute dtype
        (``exact``: the shard's), from the pool when set."""
        n, dtype = self.layout.padded_numel, self.dtype if exact else self.param_dtype
        return self.pool.take(self.xp, n, dtype) if self.pool else self.xp.empty(n, dtype)

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

    def gather_params(self, exact=False):
        """(The full flat parameters in the compute dtype (``exact``: the
        shard's), all-gathered (blocking) into a pooled buffer, on the
        parameters' device; the seconds it took)."""
        shard, dtype = self.send(exact), self.dtype if exact else self.param_dtype
        if not self.prefetchable:  # a GPU shard, or a host one (offload) copied up
            t0 = time.perf_counter()
            full = self.allgather(shard).view(dtype)
            full = upload(full) if self.xp is not xp_of(full) else full
            return full, time.perf_counter() - t0
        buf = self.take(exact)
        if self.size == 1:
            wire(buf)[...] = shard
            return buf, 0.0
        return buf, self.bc.all_gather(shard, wire(buf), "allgather(FSDP parameters)").wait()

    def gather(self, exact=False):
        """All-gather the shard (through ``source``, the prefetcher, when set;
        ``exact``: in the shard's dtype, as the state dict); point every
        parameter at its view. Returns the full array."""
        full = self.source.fetch(self) if self.source is not None and not exact \
            else self.gather_params(exact)[0]
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
        mine = self.layout.shard_of(full, self.rank)
        self.shard.array[...] = asnumpy(mine) if self.offload else mine



def wire(a):
    """``a`` as MPI carries it: bfloat16, which has no MPI type, as its
    16-bit words (a view; gathers copy bytes, they do not add)."""
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


class ShardGrad:
    """Where a flat's reduce-scatter lands (``reductions.ParamShardTarget``'s
    protocol): its shard's ``.grad``, in ``grad_dtype`` on the shard's side
    (the host under offload), while the bucket is in the reduce dtype on
    the parameters' device: the reduction is received in the bucket's kind,
    then cast (and copied to the host) into the gradient. ``round_to``: a
    dtype the reduced gradient is rounded to first (bfloat16, summed in
    float32 buckets: MPI has no bfloat16 sum)."""

    def __init__(self, flat, lo, reduce_dtype, grad_dtype, round_to=None):
        self.param, self.lo, self.flat = flat.shard, lo, flat
        self.reduce_dtype, self.grad_dtype, self.round_to = reduce_dtype, grad_dtype, round_to
        self._new = None

    @property
    def fresh(self):
        return self.param.grad is None

    def _here(self, piece):
        piece = asnumpy(piece) if self.flat.offload else piece
        if self.round_to is not None:
            piece = piece.astype(self.round_to)
        return piece.astype(self.grad_dtype, copy=False)

    def receive_into(self):
        if self._new is None:
            self._new = self.flat.xp.zeros(self.param.array.size, self.reduce_dtype)
        return self._new

    def add(self, at, piece):
        self.param.grad.array[at:at + piece.size] += self._here(piece)

    def delivered(self):
        if self.param.grad is None:  # keep_low_precision_grads: a .grad of another
            self.param._grad = Tensor(self._here(self._new))  # dtype, as PyTorch's FSDP

    def finished(self):
        self._new = None


def split_flats(params, fn, comm, **shared):
    """One flat per dtype and options dict ``fn(name, p)`` among a unit's
    ``[(name, param)]``, in order of first appearance (usually one);
    ``shared``: the ``Flat`` arguments every flat of the model takes (its
    source and pool)."""
    groups = {}
    for name, p in params:
        opts = options(fn, name, tuple(p.shape), p.dtype)
        groups.setdefault((str(p.dtype), _key(opts)), (opts, []))[1].append((name, p))
    flats = []
    for opts, group in groups.values():
        flats.append(Flat([n for n, _ in group], [p for _, p in group], comm, opts, **shared))
    return flats


def optimizer_groups(flats, fn=None):
    """``[{"params": shards, **options}]`` by each flat's options, or by
    ``fn``; ValueError when ``fn`` gives one flat's parameters different options."""
    groups = {}
    for f in flats:
        opts = [f.options] if fn is None else [
            options(fn, n, s, f.dtype) for n, s in zip(f.names, f.shapes)]
        if any(o != opts[0] for o in opts):
            table = ", ".join(f"{n}: {o}" for n, o in zip(f.names, opts))
            raise ValueError("FSDP.param_groups: one flat shard holds parameters with "
                             f"different options ({table}); pass the function as "
                             "FullyShardedDataParallel(..., param_groups=fn) to split "
                             "each unit's flat shard by options")
        groups.setdefault(_key(opts[0]), (opts[0], []))[1].append(f.shard)
    return [{"params": shards, **opts} for opts, shards in groups.values()]


class _Shape:
    """What ``param_groups``' function sees of a parameter: its shape and dtype."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype, self.ndim = shape, dtype, len(shape)

    def dim(self):
        return self.ndim


def options(fn, name, shape, dtype):
    """The options dict ``fn`` gives parameter ``name`` ({} without ``fn``)."""
    return {} if fn is None else dict(fn(name, _Shape(shape, dtype)) or {})


def _key(opts):
    """A hashable key of an options dict (its values may be lists)."""
    return repr(sorted(opts.items()))
