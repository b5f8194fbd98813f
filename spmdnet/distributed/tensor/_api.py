"""``DTensor`` on a 1-D ``DeviceMesh`` and ``distribute_tensor``.

A DTensor is a ``Parameter`` whose array is this rank's local piece, so
optimizers, ``clip_grad_norm_`` and in-place updates work on the local
shard as PyTorch's do through DTensor dispatch. Differences from PyTorch:
``.shape``/``.size()`` and arithmetic are those of the local piece (the
global shape is ``global_shape``); ``full_tensor()`` and ``to_local()``
are the ways across.
"""
import numpy as np

from ..._tensor import Tensor
from ...backend import xp_of
from ...nn.parameter import Parameter
from .. import c10d, collectives
from ._placements import Partial, Replicate, Shard, chunk_bounds


def _mesh_group(mesh, what):
    if mesh.ndim != 1:
        raise NotImplementedError(f"{what}: spmdnet's DTensor lives on a 1-D DeviceMesh, got "
                                  f"{mesh!r}")
    return mesh.get_group(0)


def _placement(placements, what):
    placements = tuple(placements)
    if len(placements) != 1:
        raise ValueError(f"{what}: one placement per mesh dimension, got {placements}")
    placement = placements[0]
    if not isinstance(placement, (Shard, Replicate, Partial)):
        raise TypeError(f"{what}: placements are Shard/Replicate/Partial, got {placement!r}")
    return placement


def gather_dim(local, dim, length, comm):
    """Concatenate every rank's ``torch.chunk`` piece along ``dim`` (pieces
    padded to one size for MPI, the padding cut off again)."""
    size = comm.Get_size()
    step = -(-length // size) if length else 0
    xp = xp_of(local)
    moved = xp.moveaxis(local, dim, 0)
    pad = step - moved.shape[0]
    if pad:
        moved = xp.concatenate([moved, xp.zeros((pad,) + moved.shape[1:], moved.dtype)])
    stacked = collectives.allgather(xp.ascontiguousarray(moved), comm)
    whole = stacked.reshape((size * step,) + moved.shape[1:])[:length]
    return xp.ascontiguousarray(xp.moveaxis(whole, 0, dim))


def reduce_scatter_dim(full, dim, comm, op="mean"):
    """This rank's ``torch.chunk`` piece along ``dim`` of the reduction of ``full``."""
    size, rank = comm.Get_size(), comm.Get_rank()
    length = full.shape[dim]
    step = -(-length // size) if length else 0
    xp = xp_of(full)
    moved = xp.moveaxis(full, dim, 0)
    pad = size * step - length
    if pad:
        moved = xp.concatenate([moved, xp.zeros((pad,) + moved.shape[1:], moved.dtype)])
    piece = collectives.reduce_scatter_block(xp.ascontiguousarray(moved), op, comm)
    start, stop = chunk_bounds(length, size, rank)
    return xp.ascontiguousarray(xp.moveaxis(piece[:stop - start], 0, dim))


class DTensor(Parameter):
    """A tensor laid out over a DeviceMesh; its array is the local piece."""

    def __init__(self, local, device_mesh, placements, global_shape, requires_grad=False):
        super().__init__(local, requires_grad=requires_grad)
        self.device_mesh = device_mesh
        self.placements = tuple(placements)
        self.global_shape = tuple(global_shape)

    @staticmethod
    def from_local(local_tensor, device_mesh=None, placements=None, *, run_check=False,
                   shape=None, stride=None):
        """PyTorch's: every rank's local piece joined under ``placements``."""
        placement = _placement(placements or (Replicate(),), "DTensor.from_local")
        arr = local_tensor.array if isinstance(local_tensor, Tensor) else np.asarray(local_tensor)
        if shape is None:
            shape = list(arr.shape)
            if isinstance(placement, Shard):
                counts = collectives.allgather(np.array(arr.shape[placement.dim]),
                                               _mesh_group(device_mesh, "from_local").comm)
                shape[placement.dim] = int(counts.sum())
        requires_grad = isinstance(local_tensor, Tensor) and local_tensor.requires_grad
        return DTensor(arr, device_mesh, (placement,), shape, requires_grad)

    def to_local(self, *, grad_placements=None):
        """This rank's piece: a Tensor sharing the DTensor's memory."""
        return Tensor(self.array)

    def full_tensor(self, *, grad_placements=None):
        """The whole tensor on every rank (a collective over the mesh)."""
        comm = _mesh_group(self.device_mesh, "full_tensor").comm
        placement = self.placements[0]
        if isinstance(placement, Replicate):
            return Tensor(self.array.copy())
        if isinstance(placement, Partial):
            op = "mean" if placement.reduce_op == "avg" else placement.reduce_op
            return Tensor(collectives.allreduce(self.array.copy(), op, comm))
        return Tensor(gather_dim(self.array, placement.dim,
                                 self.global_shape[placement.dim], comm))

    def combine_shard_norms(self, local_norm, norm_type, parameters):
        """``clip_grad_norm_``'s total over every rank's shards, from this
        rank's ``local_norm`` of its pieces (a collective over the mesh)."""
        group = _mesh_group(self.device_mesh, "clip_grad_norm_")
        for p in parameters:
            if p.grad is not None and (not isinstance(p, DTensor)
                                       or not isinstance(p.placements[0], Shard)
                                       or p.device_mesh.get_group(0) is not group):
                raise ValueError(f"clip_grad_norm_ over a mix of sharded and other "
                                 f"parameters ({type(p).__name__} with placements "
                                 f"{getattr(p, 'placements', None)}): clip each group alone")
        local = float(local_norm)
        if norm_type == float("inf"):
            total = collectives.allreduce(local, "max", group.comm)
        else:
            total = collectives.allreduce(local ** norm_type, "sum", group.comm) ** (1 / norm_type)
        return type(local_norm)(total)

    def __repr__(self):
        return (f"DTensor(local_tensor={Tensor.__repr__(Tensor(self.array))}, "
                f"device_mesh={self.device_mesh!r}, placements={self.placements})")


def local_piece(full, mesh, placement):
    """The piece of the whole array ``full`` this rank holds under ``placement``."""
    if isinstance(placement, Shard):
        comm = _mesh_group(mesh, "distribute_tensor").comm
        dim = placement.dim % full.ndim
        start, stop = chunk_bounds(full.shape[dim], comm.Get_size(), comm.Get_rank())
        index = (slice(None),) * dim + (slice(start, stop),)
        return xp_of(full).ascontiguousarray(full[index]), dim
    if isinstance(placement, Partial):
        raise NotImplementedError("distribute_tensor(placements=[Partial()]) is not "
                                  "supported by spmdnet: use Shard or Replicate")
    return full.copy(), None


def distribute_tensor(tensor, device_mesh=None, placements=None, *, src_data_rank=0):
    """PyTorch's: rank ``src_data_rank``'s ``tensor`` laid out over the mesh
    (``src_data_rank=None``: every rank's own tensor, no communication)."""
    if device_mesh is None:
        raise NotImplementedError("distribute_tensor needs a device_mesh in spmdnet "
                                  "(init_device_mesh)")
    comm = _mesh_group(device_mesh, "distribute_tensor").comm
    placement = _placement(placements or (Replicate(),), "distribute_tensor")
    full = tensor.array if isinstance(tensor, Tensor) else np.asarray(tensor)
    if src_data_rank is not None:
        root = c10d.as_group(device_mesh.get_group(0)).group_rank(src_data_rank, "src_data_rank")
        full = collectives.bcast(full.copy(), root, comm)
    local, dim = local_piece(full, device_mesh, placement)
    if dim is not None:
        placement = Shard(dim)
    return DTensor(local, device_mesh, (placement,), full.shape,
                   isinstance(tensor, Tensor) and tensor.requires_grad)
