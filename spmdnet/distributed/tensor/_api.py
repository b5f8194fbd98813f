"""``DTensor`` on a ``DeviceMesh`` and ``distribute_tensor``.

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


def _placements(mesh, placements, what):
    """``placements`` (one per mesh dimension; None: all Replicate) checked:
    Shard/Replicate/Partial, at most one of them not Replicate."""
    placements = (Replicate(),) * mesh.ndim if placements is None else tuple(placements)
    if len(placements) != mesh.ndim:
        raise ValueError(f"{what}: one placement per dimension of {mesh!r}, got {placements}")
    for p in placements:
        if not isinstance(p, (Shard, Replicate, Partial)):
            raise TypeError(f"{what}: placements are Shard/Replicate/Partial, got {p!r}")
    if sum(not isinstance(p, Replicate) for p in placements) > 1:
        raise NotImplementedError(f"{what}: spmdnet lays a tensor out over one mesh dimension "
                                  f"(Replicate on the others), got {placements}")
    return placements


def _active(mesh, placements):
    """(the mesh dimension's group, its placement) of the one placement that
    is not Replicate, or (None, Replicate())."""
    for dim, p in enumerate(placements):
        if not isinstance(p, Replicate):
            return mesh.get_group(dim), p
    return None, Replicate()


def _shard_group(tensor):
    """The process group a DTensor is sharded over (None: not a sharded DTensor)."""
    if not isinstance(tensor, DTensor):
        return None
    group, placement = _active(tensor.device_mesh, tensor.placements)
    return group if isinstance(placement, Shard) else None


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
        placements = _placements(device_mesh, placements, "DTensor.from_local")
        arr = local_tensor.array if isinstance(local_tensor, Tensor) else np.asarray(local_tensor)
        group, placement = _active(device_mesh, placements)
        if isinstance(placement, Shard):
            placements = tuple(Shard(p.dim % arr.ndim) if p is placement else p
                               for p in placements)
        if shape is None:
            shape = list(arr.shape)
            if isinstance(placement, Shard):
                dim = placement.dim % arr.ndim
                counts = collectives.allgather(np.array(arr.shape[dim]), group.comm)
                shape[dim] = int(counts.sum())
        requires_grad = isinstance(local_tensor, Tensor) and local_tensor.requires_grad
        return DTensor(arr, device_mesh, placements, shape, requires_grad)

    def to_local(self, *, grad_placements=None):
        """This rank's piece: a Tensor sharing the DTensor's memory."""
        return Tensor(self.array)

    def full_tensor(self, *, grad_placements=None):
        """The whole tensor on every rank (a collective over the mesh)."""
        group, placement = _active(self.device_mesh, self.placements)
        if isinstance(placement, Partial):
            op = "mean" if placement.reduce_op == "avg" else placement.reduce_op
            return Tensor(collectives.allreduce(self.array.copy(), op, group.comm))
        return Tensor(gather_like(self, self.array))

    def combine_shard_norms(self, local_norm, norm_type, parameters):
        """``clip_grad_norm_``'s total over every rank's shards, from this
        rank's ``local_norm`` of its pieces (a collective over the mesh)."""
        group = _shard_group(self)
        for p in parameters:
            if p.grad is not None and (group is None or _shard_group(p) is not group):
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


def gather_like(like, array):
    """The whole array of which ``array`` is this rank's piece when laid out
    as the DTensor ``like`` (a collective over its Shard mesh dimension);
    a copy of ``array`` when ``like`` is replicated."""
    group, placement = _active(like.device_mesh, like.placements)
    if not isinstance(placement, Shard):
        return array.copy()
    return gather_dim(array, placement.dim, like.global_shape[placement.dim], group.comm)


def local_piece(full, mesh, placements):
    """(The piece of the whole array ``full`` this rank holds under
    ``placements`` (or one placement, on a 1-D mesh), the placements with
    Shard's dim made non-negative)."""
    if isinstance(placements, (Shard, Replicate, Partial)):
        placements = (placements,)
    placements = _placements(mesh, placements, "distribute_tensor")
    group, placement = _active(mesh, placements)
    if isinstance(placement, Partial):
        raise NotImplementedError("distribute_tensor(placements=[Partial()]) is not "
                                  "supported by spmdnet: use Shard or Replicate")
    if group is None:
        return full.copy(), placements
    comm = group.comm
    dim = placement.dim % full.ndim
    start, stop = chunk_bounds(full.shape[dim], comm.Get_size(), comm.Get_rank())
    index = (slice(None),) * dim + (slice(start, stop),)
    placements = tuple(Shard(dim) if p is placement else p for p in placements)
    return xp_of(full).ascontiguousarray(full[index]), placements


def _broadcast(full, mesh, src):
    """Global rank ``src``'s ``full`` on every rank of the mesh: one
    broadcast along each mesh dimension, the last first."""
    where = np.argwhere(mesh.mesh == src)
    if not len(where):
        raise ValueError(f"distribute_tensor(src_data_rank={src}): rank {src} is not in "
                         f"{mesh!r}")
    source, mine = tuple(int(i) for i in where[0]), mesh.get_coordinate()
    for dim in reversed(range(mesh.ndim)):
        root_at = list(mine)
        root_at[dim] = source[dim]
        group = c10d.as_group(mesh.get_group(dim))
        root = group.group_rank(int(mesh.mesh[tuple(root_at)]), "src_data_rank")
        full = collectives.bcast(full, root, group.comm)
    return full


def distribute_tensor(tensor, device_mesh=None, placements=None, *, src_data_rank=0):
    """PyTorch's: rank ``src_data_rank``'s ``tensor`` laid out over the mesh
    (``src_data_rank=None``: every rank's own tensor, no communication)."""
    if device_mesh is None:
        raise NotImplementedError("distribute_tensor needs a device_mesh in spmdnet "
                                  "(init_device_mesh)")
    placements = _placements(device_mesh, placements, "distribute_tensor")
    full = tensor.array if isinstance(tensor, Tensor) else np.asarray(tensor)
    if src_data_rank is not None:
        full = _broadcast(full.copy(), device_mesh, src_data_rank)
    local, placements = local_piece(full, device_mesh, placements)
    return DTensor(local, device_mesh, placements, full.shape,
                   isinstance(tensor, Tensor) and tensor.requires_grad)
