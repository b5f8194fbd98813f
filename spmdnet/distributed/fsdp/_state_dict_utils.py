"""``FullyShardedDataParallel``'s state: the full state dict with the
original model's keys (every rank, or rank 0 only as ``state_dict_type``
chooses), a per-rank sharded checkpoint, the full optimizer state by
parameter name; and NO_SHARD's wrapper (``Unsharded``: data parallelism
whose state has the model's own keys, as FSDP's full state)."""
import contextlib

import numpy as np

from ... import distributed as dist
from ...backend import xp_of
from ...nn.parallel.distributed import DistributedDataParallel
from ._optim_utils import full_optim_state, load_full_optim_state
from .api import FullStateDictConfig, StateDictType


class StateDictMode:
    """What ``state_dict_type`` chose for the FSDP modules of a model:
    ``rank0_only`` (the full state on rank 0, {} on the others)."""
    rank0_only = False

    def _for_this_rank(self, state, rank0_only=None):
        only0 = self.rank0_only if rank0_only is None else rank0_only
        return {} if only0 and dist.get_rank() != 0 else state

    def state_dict(self, *args, rank0_only=None, **kwargs):
        """The full state with the original model's keys (every rank, or rank 0
        only: ``rank0_only``, default as ``state_dict_type`` set). Sharded:
        Tensors that are copies, on the model's device; between forward and
        backward too, units whose full parameters a pending backward holds
        stay as they are (not gathered, not freed). The wrapped model's own
        ``state_dict()`` gives the same (``_module_hooks.state_hooks``).
        Collective."""
        return self._for_this_rank(self.module.state_dict(*args, **kwargs), rank0_only)

    def load_state_dict(self, state, strict=True):
        """Load a full state (as ``state_dict`` returns); sharded, each rank
        keeps its shards (as the wrapped model's own ``load_state_dict``), and
        not between forward and backward (RuntimeError): the pending backward
        would recompute or differentiate with other parameters."""
        return self.module.load_state_dict(state, strict=strict)

    @staticmethod
    @contextlib.contextmanager
    def state_dict_type(module, state_dict_type, state_dict_config=None,
                        optim_state_dict_config=None):
        """``with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
        FullStateDictConfig(rank0_only=True)):`` (the full state is the one type)."""
        previous = StateDictMode.set_state_dict_type(
            module, state_dict_type, state_dict_config, optim_state_dict_config)
        try:
            yield
        finally:
            for wrapper, rank0_only in previous:
                wrapper.rank0_only = rank0_only

    @staticmethod
    def set_state_dict_type(module, state_dict_type, state_dict_config=None,
                            optim_state_dict_config=None):
        """Set the state-dict type of every FSDP module in ``module``; returns
        [(wrapper, its previous rank0_only)]. FULL_STATE_DICT only."""
        if state_dict_type is not StateDictType.FULL_STATE_DICT:
            raise NotImplementedError(f"{state_dict_type}: spmdnet's FSDP state is the full "
                                      "state (StateDictType.FULL_STATE_DICT)")
        config = state_dict_config or FullStateDictConfig()
        wrappers = [m for m in module.modules() if isinstance(m, StateDictMode)]
        if isinstance(module, StateDictMode) and module not in wrappers:
            wrappers.append(module)  # FSDP holds its model outside its submodules
        previous = [(w, w.rank0_only) for w in wrappers]
        for wrapper in wrappers:
            wrapper.rank0_only = bool(getattr(config, "rank0_only", False))
        return previous


class Unsharded(StateDictMode, DistributedDataParallel):
    """NO_SHARD: data parallelism; the state has the model's own keys."""


class ShardedState(StateDictMode):
    """The state methods of the sharded wrapper (``flats()``, ``module``,
    ``size`` and ``_open_forward`` are the wrapper's)."""

    def check_loadable(self):
        if self._open_forward:
            raise RuntimeError("FSDP.load_state_dict called between forward and backward: "
                               "the pending backward needs the parameters its forward "
                               "used; run backward first (or the forward under no_grad)")

    def sharded_state_dict(self):
        """This rank's shards and the model's buffers, for a per-rank checkpoint."""
        return {"world_size": self.size,
                "shards": [np.array(f.shard.array, copy=True) for f in self.flats()],
                "buffers": {k: np.array(b.array, copy=True)
                            for k, b in self.module.named_buffers()}}

    def load_sharded_state_dict(self, state):
        if state["world_size"] != self.size or len(state["shards"]) != len(self.flats()):
            raise ValueError(f"load_sharded_state_dict: saved by {state['world_size']} ranks "
                             f"with {len(state['shards'])} shards, this model has {self.size} "
                             f"ranks and {len(self.flats())} shards (load a full state instead)")
        for f, arr in zip(self.flats(), state["shards"]):
            if arr.shape != f.shard.shape:
                raise ValueError(f"load_sharded_state_dict: shard of {f.names} has shape "
                                 f"{arr.shape}, expected {f.shard.shape}")
            f.shard.array[...] = xp_of(f.shard.array).asarray(arr)  # offload: on the host
        for k, b in self.module.named_buffers():
            b.array[...] = xp_of(b.array).asarray(state["buffers"][k])

    def optim_state_dict(self, opt):
        """``opt``'s full state keyed by the original parameter names
        (collective; also callable as PyTorch's ``FSDP.optim_state_dict(model,
        optim)``): ``{"state": {name: {key: array}}, "param_groups": [{...,
        "params": [names]}]}``."""
        return full_optim_state(self.flats(), opt)

    def load_optim_state_dict(self, opt, state):
        """Load a full optimizer state (``optim_state_dict``) into ``opt``'s shards."""
        load_full_optim_state(self.flats(), opt, state)
