"""How ``state_dict``'s helpers see a model: unwrap DDP and FSDP1, and move
values between full tensors and a ``fully_shard`` model's DTensor shards."""
import numpy as np

from ..._tensor import Tensor
from ...backend import asnumpy
from ...nn.parallel.distributed import DistributedDataParallel
from ..fsdp.fully_sharded_data_parallel import FullyShardedDataParallel as ShardedFSDP1
from .. import collectives, runtime
from ..tensor._api import DTensor, gather_like, local_piece


def unwrap(model):
    """("fsdp1", model) for FullyShardedDataParallel, else ("module", the
    module whose keys the state uses: DDP's ``.module``, or the model)."""
    if isinstance(model, ShardedFSDP1):
        return "fsdp1", model
    if isinstance(model, DistributedDataParallel):
        return "module", model.module
    return "module", model


def param_names(module):
    """id(parameter) -> its name in the module's state."""
    return {id(p): name for name, p in module.named_parameters(remove_duplicate=False)}


def as_array(value):
    """A Tensor's (or DTensor's local) array; any other value as it is."""
    return value.array if isinstance(value, Tensor) else value


def shard_value(like, array, full):
    """``array`` as ``like`` (a DTensor parameter) holds it: its full value
    gathered (``full``), else a DTensor sharing this rank's piece."""
    if full:
        return Tensor(gather_like(like, array))
    return DTensor(array, like.device_mesh, like.placements, like.global_shape)


def local_value(like, value):
    """This rank's piece for the DTensor ``like`` of a loaded ``value``: a
    DTensor's own piece, or the rows of a full tensor or array."""
    if isinstance(value, DTensor):
        return value.array
    array = as_array(value)
    if tuple(np.shape(array)) != like.global_shape:
        raise ValueError(f"a value of shape {tuple(np.shape(array))} for a parameter of "
                         f"global shape {like.global_shape}")
    return local_piece(array, like.device_mesh, like.placements)[0]


def offload(state, full):
    """``cpu_offload``: host copies; with the full state only rank 0 keeps them."""
    if full and runtime.world().rank != 0:
        return {}
    return {k: _host(v) for k, v in state.items()}


def _host(value):
    if isinstance(value, dict):
        return {k: _host(v) for k, v in value.items()}
    if isinstance(value, DTensor):
        return DTensor(np.array(asnumpy(value.array)), value.device_mesh, value.placements,
                       value.global_shape)
    if isinstance(value, Tensor):
        return Tensor(np.array(asnumpy(value.array)))
    return value


def from_rank0(state):
    """``broadcast_from_rank0``: rank 0's full state on every rank (host arrays)."""
    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return np.array(asnumpy(as_array(value))) if isinstance(value, Tensor) else value
    ours = plain(state) if runtime.world().rank == 0 else None
    return collectives.bcast(ours, 0, runtime.world().comm)
