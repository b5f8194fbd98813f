"""One ``fully_shard`` unit's state: its sharded parameters, the storage
their gathered values live in, and the forward and backward hooks' work.

Unit life in a training step (PyTorch's FSDP2 order):

- pre-forward: all-gather every shard into the unit's ``UnshardedStorage``
  (``_fsdp_storage``) and register the full Parameters (views of it).
- post-forward: every output tensor passes through ``PreBackward``, an
  identity whose backward all-gathers into the same storage (when it was
  released) before any of the unit's operations runs its backward; outputs
  that are views of the storage are copied. When the unit reshards after
  forward, the storage's memory is then released (the graph's saved arrays
  are views of it and stay valid) and the shards are registered again.
- post-backward: every unit with trainable parameters that ran a forward
  with grad enabled starts its gradients' reduce-scatter (``_fsdp_grads``:
  the unit's ``ParamAndGradBuffer``, zeros where no gradient arrived) on
  every rank, in the reverse order of the units' first such forward
  (``Backward``): which gradients arrived depends on this rank's data, so
  it decides neither whether nor when in that order a unit's collective
  starts. A unit whose parameters the graph reaches from its outputs all
  have their final gradients (post-accumulate-grad hooks) is ready: it
  starts (and its storage is released) as soon as every unit after it in
  forward order has started, so it overlaps the earlier units' backward;
  the end-of-backward callback starts the rest in that order, reshards any
  unit left gathered and completes the reductions. A unit with frozen
  parameters (whose operations may still need them after the others'
  gradients are final) is never ready before the end of backward.
- ``reshard_after_forward=k`` (an int): after forward each rank keeps its
  1/k piece of every full parameter (``torch.chunk`` pieces within its
  group of k consecutive shard ranks) and backward all-gathers from that
  group only.
"""
import weakref

from ... import autograd
from ..._tensor import Tensor
from ...autograd import Function
from ...nn.parameter import Parameter
from ..tensor._api import gather_dim
from ..tensor._placements import chunk_bounds
from ._fsdp_grads import CHANNELS, IN_FLIGHT, unit_buffer
from ._fsdp_storage import UnshardedStorage, on_device


class Entry:
    """One sharded parameter: where it is registered (every (module, name)
    of a tied parameter), its shard (a DTensor), the sharded dimension, and
    ``full``, the Parameter over the unit's storage used by forward and
    backward while the unit is unsharded."""

    def __init__(self, slots, shard, dim):
        self.slots, self.shard, self.dim, self.full = slots, shard, dim, None
        self.kept = None  # the 1/k piece kept after forward (reshard_after_forward=k)

    def register(self, tensor):
        for owner, name in self.slots:
            owner._parameters[name] = tensor


def map_tensors(value, fn):
    """``value`` (nested tuples/lists/dicts) with each Tensor t replaced by fn(t)."""
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(map_tensors(v, fn) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def tensors_in(value):
    found = []
    map_tensors(value, found.append)
    return found


class Backward:
    """One root's units (the root is the unit whose forward runs outside any
    other's) that ran a forward with grad enabled since its last backward
    ended: ``order`` (those with trainable parameters, in the order
    of their first such forward: the same on every rank, as the forwards'
    all-gathers are collective) and ``held`` (all of them); ``ready``: the
    units of ``order`` whose gradients are final on this rank."""

    def __init__(self):
        self.order, self.held, self.ready, self.queued = [], [], set(), False

    def ran(self, state):
        if state not in self.held:
            self.held.append(state)
            if state.trainable:
                self.order.append(state)

    def queue(self):
        if not self.queued:
            self.queued = True
            autograd.queue_callback(self.end)

    def mark_ready(self, state):
        """Start the reductions of the ready units at the end of ``order``."""
        if state not in self.order:
            return
        self.ready.add(state)
        while self.order and self.order[-1] in self.ready:
            unit = self.order.pop()
            self.ready.discard(unit)
            unit.post_backward()

    def end(self):
        """End of backward: the units not started yet start (in order), a
        unit left gathered reshards, every reduction completes."""
        order, held = self.order, self.held
        self.order, self.held, self.ready, self.queued = [], [], set(), False
        for state in reversed(order):
            state.post_backward()
        for state in held:
            state.expected, state.arrived = set(), set()
            if state.filled:
                state.post_backward(start=False)
        IN_FLIGHT.finish_all()


_current = {"backward": None}  # the running root's Backward


def _release(channels):
    for bc in channels:
        CHANNELS.release(bc)


class PreBackward(Function):
    """Identity on a unit's output; its backward gathers the unit's
    parameters (once per backward) before the unit's operations need them."""

    def forward(self, x, state=None):
        self.state = state
        return x.copy() if state.storage.holds(x) else x

    def backward(self, g):
        self.state.pre_backward()
        return g


class FSDPState:
    def __init__(self, module, entries, device, shard_comm, replicate_comm, kept_comm,
                 reshard_after_forward, mp_policy):
        self.module, self.entries, self.mp, self.device = module, entries, mp_policy, device
        self.shard_comm, self.kept_comm = shard_comm, kept_comm
        self.reshard_after_forward = reshard_after_forward
        self.replicate_comm = replicate_comm
        self.reduce_dtype = mp_policy.reduce_dtype if mp_policy.reduce_dtype is not None \
            else mp_policy.param_dtype
        self.buffer = self.votes = None  # the gradients' (see _build)
        self.storage = None
        self.filled = False  # the storage holds the gathered parameters
        self.sync, self.root = True, False
        self.expected, self.arrived = set(), set()  # id(full): gradients due, come
        self.eager = False  # post-backward as soon as the gradients are final (see _build)
        self.trainable = any(e.shard.requires_grad for e in entries)
        self.backward = None  # the Backward of the root this unit last ran under
        self.own = Backward()  # used while this unit is the root
        self.inputs = set()  # id of the forward's input tensors: where the graph walk stops

    # -- parameters --------------------------------------------------------------------
    def _build(self):
        dtype = self.mp.param_dtype
        specs = [(e.shard.global_shape, dtype or e.shard.array.dtype) for e in self.entries]
        self.storage = UnshardedStorage(specs, self.device)
        self.eager = all(e.shard.requires_grad for e in self.entries)
        for e, view in zip(self.entries, self.storage.views):
            e.full = Parameter(view, requires_grad=e.shard.requires_grad)
            if e.full.requires_grad:
                e.full.register_post_accumulate_grad_hook(self._grad_ready)
        trainable = [e for e in self.entries if e.full.requires_grad]
        if trainable:
            self.buffer, self.votes, channels = unit_buffer(
                trainable, self._names(trainable), self.shard_comm,
                self.replicate_comm, self.reduce_dtype)
            weakref.finalize(self, _release, channels)

    def _names(self, entries):
        """Each entry's parameter name in the module (one walk of its tree)."""
        paths = {id(m): path for path, m in self.module.named_modules()}
        return [f"{paths.get(id(owner), type(owner).__name__)}.{name}".lstrip(".")
                for owner, name in (entry.slots[0] for entry in entries)]

    def _gather(self, e):
        length = e.shard.global_shape[e.dim]
        if e.kept is not None:
            return gather_dim(e.kept, e.dim, length, self.kept_comm)
        return gather_dim(on_device(e.shard.array, self.device), e.dim, length, self.shard_comm)

    def fill(self):
        """All-gather the shards (or, in backward, the kept pieces) into the storage."""
        if self.storage is None:
            self._build()
        for e, view in zip(self.entries, self.storage.views):
            arr = self._gather(e)
            view[...] = arr if arr.dtype == view.dtype else arr.astype(view.dtype)
            e.kept = None
        self.storage.resident = self.filled = True

    def unshard(self):
        self.fill()
        for e in self.entries:
            e.register(e.full)

    def reshard(self, keep=False):
        """Register the shards again and release the storage (after keeping
        each rank's piece of the full parameters within ``kept_comm``, when
        ``keep``)."""
        for e in self.entries:
            e.register(e.shard)
            e.kept = None
            if keep and self.filled:
                size, rank = self.kept_comm.Get_size(), self.kept_comm.Get_rank()
                start, stop = chunk_bounds(e.shard.global_shape[e.dim], size, rank)
                index = (slice(None),) * e.dim + (slice(start, stop),)
                e.kept = e.full.array[index].copy()
        if self.filled:
            self.storage.release()
            self.filled = False

    # -- forward ------------------------------------------------------------------------
    def pre_forward(self, args, kwargs, root):
        self.root = root
        if root or _current["backward"] is None:
            self.own.queued = False  # (a backward that raised left it set)
            _current["backward"] = self.own
        self.backward = _current["backward"]
        if self.entries and autograd.is_grad_enabled():
            self.backward.ran(self)
        for e in self.entries:  # the shards may have changed since a forward kept pieces
            e.kept = None
        self.unshard()
        self.inputs = {id(t) for t in tensors_in((args, kwargs))}

    def post_forward(self, output):
        """Reshard as configured; returns the output (wrapped for the pre-backward)."""
        reshard = self.reshard_after_forward
        if not self.entries:  # nothing to gather again in backward
            return output
        if reshard is None:
            reshard = not self.root
        if not autograd.is_grad_enabled():  # no backward comes to reshard
            output = map_tensors(output, self._own)
            self.reshard()
            return output
        self._expect(output)
        # linked even when it stays unsharded: a no_grad forward before this
        # backward would reshard it, and the backward then gathers it again
        output = map_tensors(output, self._link)
        if reshard is not False:
            self.reshard(keep=reshard is not True)
        return output

    def _own(self, t):
        return Tensor(t.array.copy()) if self.storage.holds(t.array) else t

    def _link(self, t):
        return PreBackward.apply(t, state=self) if t.requires_grad else self._own(t)

    def _expect(self, output):
        """Note the full parameters the graph reaches from ``output`` back to
        the unit's inputs: the gradients this unit's post-backward waits for."""
        full = {id(e.full) for e in self.entries if e.full is not None and e.full.requires_grad}
        stack, seen = [t for t in tensors_in(output) if t.requires_grad], set()
        while stack:
            t = stack.pop()
            key = id(t)
            if key in seen or key in self.inputs:
                continue
            seen.add(key)
            if key in full:
                self.expected.add(key)
            elif t._ctx is not None and not getattr(t._ctx, "freed", None):
                stack.extend(p for p in t._ctx.parents if p.requires_grad)

    # -- backward -----------------------------------------------------------------------
    def pre_backward(self):
        if not self.filled:
            self.unshard()
        self._queue()

    def _queue(self):
        self.backward.queue()

    def _grad_ready(self, full):
        if not self.filled:
            name = self._names([next(e for e in self.entries if e.full is full)])[0]
            raise RuntimeError(
                f"fully_shard({type(self.module).__name__}): the gradient of {name} was "
                "computed while the unit was resharded (its storage released), so backward "
                "may have read freed parameters: the operation's result reached the loss "
                "without passing through the module's forward output; return it from "
                "forward, or use reshard_after_forward=False for this module")
        self.arrived.add(id(full))
        self._queue()
        IN_FLIGHT.poll()
        if self.eager and self.filled and self.expected and self.expected <= self.arrived:
            self.backward.mark_ready(self)

    def post_backward(self, start=True):
        """The unit's gradients are final: with ``start`` (every rank calls
        it for the same units in the same order, see ``Backward``) their
        reduce-scatter starts, zeros for gradients that did not arrive on
        this rank; without gradient sync (or ``start``) this rank's
        gradients are kept, unreduced, in the buffer's storage, and later
        ones add to them. The storage is released."""
        self.expected, self.arrived = set(), set()
        if self.buffer is not None:
            # a second post-backward in one backward (a unit run twice): the
            # first reduction lands before the new gradients are collected
            IN_FLIGHT.finish_through(self.buffer)
            got = [e.full for e in self.entries if e.full is not None and e.full.grad is not None]
            self.votes.got(got)
            if self.sync and start:
                self.votes.start()
                self.buffer.start(self.buffer.buckets)
                IN_FLIGHT.started(self.buffer)
            elif got:
                self.buffer.collect(self.buffer.buckets)
        self.reshard()
