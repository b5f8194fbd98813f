"""ZeroRedundancyOptimizer: ZeRO stage 1, PyTorch's name and usage.

All parameters become views into one flat buffer, padded to a multiple of
the communicator size P and cut into P equal shards; rank r owns shard r.
``step()`` runs the wrapped optimizer on this rank's shard only (so its
state, e.g. Adam's two moments, takes 1/P of the memory), then one
in-place Allgather of the flat buffer gives every rank every parameter.

Two ways to get the gradients:
- over DataParallel (default): gradients are already averaged; each rank
  reads its shard of them.
- ``reduce_gradients=True``, without DataParallel: one Reduce_scatter hands
  each rank the averaged shard it needs. Reduce-scatter + allgather move the
  bytes of one allreduce, so this costs no more than plain data parallelism
  while the optimizer work and state are divided by P.
"""
import numpy as np

from .. import distributed as dist
from .._tensor import Tensor
from ..backend import xp_of
from ..nn.parameter import Parameter
from ..optim import Adam


class ZeroRedundancyOptimizer:
    """Shard ``optimizer_class``'s state over ``comm`` (ZeRO-1)."""

    def __init__(self, params, optimizer_class=Adam, comm=None, reduce_gradients=False,
                 **defaults):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ZeroRedundancyOptimizer got no parameters that require grad")
        dtypes = {str(p.data.dtype) for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"ZeroRedundancyOptimizer needs one dtype, got {sorted(dtypes)}")
        self.comm = dist.comm_or_default(comm)
        self.size, self.rank = self.comm.Get_size(), self.comm.Get_rank()
        self.reduce_gradients = reduce_gradients
        self._build_flat()
        self.shard_param = Parameter(self.flat[self.lo:self.hi])
        self.optim = optimizer_class([self.shard_param], **defaults)
        self.defaults = self.optim.defaults
        self.param_groups = self.optim.param_groups

    def _build_flat(self):
        """One padded flat buffer; every parameter's data becomes a view of it."""
        first = self.params[0].data
        xp = xp_of(first)
        self.numel = sum(p.data.size for p in self.params)
        self.shard_size = -(-self.numel // self.size)  # ceil: the last shard is padded
        self.flat = xp.zeros(self.shard_size * self.size, dtype=first.dtype)
        self.offsets, offset = [], 0
        for p in self.params:
            view = self.flat[offset:offset + p.data.size].reshape(p.data.shape)
            view[...] = p.data
            p.data = view  # from now on updated in place by the allgather
            self.offsets.append(offset)
            offset += p.data.size
        self.lo, self.hi = self.rank * self.shard_size, (self.rank + 1) * self.shard_size
        self.grad_shard = xp.zeros(self.shard_size, dtype=first.dtype)
        self._grad_shard_tensor = Tensor(self.grad_shard)  # the shard's .grad, made once

    # -- the step --------------------------------------------------------------------
    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        if self.reduce_gradients:
            self._reduce_scatter_grads()
        else:
            self._copy_grad_shard()
        self.shard_param.grad = self._grad_shard_tensor
        self.optim.step()
        self._allgather_params()
        return loss

    def _segments(self):
        """(param, index, start, stop) of the parts of parameters in this shard,
        as positions within the parameter's flattened data."""
        for i, (p, off) in enumerate(zip(self.params, self.offsets)):
            start, stop = max(off, self.lo), min(off + p.data.size, self.hi)
            if start < stop:
                yield p, i, start - off, stop - off

    def _copy_grad_shard(self):
        self.grad_shard[...] = 0
        for p, i, start, stop in self._segments():
            if p.grad is not None:
                at = self.offsets[i] + start - self.lo
                self.grad_shard[at:at + stop - start] = p.grad.data.reshape(-1)[start:stop]

    def _reduce_scatter_grads(self):
        xp = xp_of(self.flat)
        full = xp.zeros_like(self.flat)
        for p, off in zip(self.params, self.offsets):
            if p.grad is not None:
                full[off:off + p.data.size] = p.grad.data.reshape(-1)
        shard = dist.reduce_scatter(full, op="mean", comm=self.comm)
        self.grad_shard[...] = shard

    def _allgather_params(self):
        in_place = dist.mpi().IN_PLACE
        with dist.guarded("allgather(zero parameters)", self.comm, self.flat):
            dist.on_host(self.flat, lambda buf: self.comm.Allgather(in_place, buf))

    # -- state ---------------------------------------------------------------------
    def state_bytes(self):
        """Bytes of optimizer state this rank holds (the saving is ~1/P)."""
        state = self.optim.state.get(self.shard_param, {})
        return sum(v.nbytes for k, v in state.items() if hasattr(v, "nbytes") and
                   not k.startswith("_"))

    def state_dict(self):
        """The full, unsharded optimizer state (collective: every rank calls it),
        laid out like the wrapped optimizer's own state_dict over ``params``."""
        inner = self.optim.state_dict()
        shard_state = inner["state"].get(0, {})
        with dist.guarded("broadcast(optimizer state keys)", self.comm):
            keys = self.comm.bcast(sorted(shard_state), root=0)
        full = {}
        for key in keys:
            value = shard_state[key]
            if np.ndim(value) == 0:
                full[key] = value
                continue
            gathered = dist.allgather(np.asarray(value), comm=self.comm).reshape(-1)
            full[key] = gathered
        state = {}
        for i, (p, off) in enumerate(zip(self.params, self.offsets)):
            if keys:
                state[i] = {k: (v[off:off + p.data.size].reshape(p.data.shape).copy()
                                if np.ndim(v) else v) for k, v in full.items()}
        group = dict(inner["param_groups"][0], params=list(range(len(self.params))))
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict):
        """Load a full (unsharded) state: each rank keeps its shard."""
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"state_dict has {sum(len(g['params']) for g in groups)} "
                             f"parameters in {len(groups)} groups; this optimizer has "
                             f"{len(self.params)} in 1")
        shard = {}
        entries = state_dict["state"]
        if entries:
            keys = entries[0].keys()
            for key in keys:
                values = [entries[i][key] for i in range(len(self.params))]
                if np.ndim(values[0]) == 0:
                    shard[key] = values[0]
                    continue
                flat = np.zeros(self.shard_size * self.size, dtype=np.asarray(values[0]).dtype)
                for v, p, off in zip(values, self.params, self.offsets):
                    flat[off:off + p.data.size] = np.asarray(v).reshape(-1)
                shard[key] = flat[self.lo:self.hi]
        group = dict(groups[0], params=[0])
        self.optim.load_state_dict({"state": {0: shard} if shard else {},
                                    "param_groups": [group]})
