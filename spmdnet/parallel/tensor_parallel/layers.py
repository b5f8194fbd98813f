"""Tensor-parallel linear layers (Megatron), dropout streams, and state dicts.

A column layer splits the output features over the TP group, a row layer
the input features; a column layer followed by a row layer (an MLP block)
needs no communication in between and one allreduce each way::

    x ─f─> ColumnParallelLinear ─> act ─> RowParallelLinear ─g─> + bias
           (rank t: rows t of W1)         (rank t: columns t of W2)

Each layer draws the full weight exactly as ``nn.Linear`` with the same seed
would (same generator calls, same order) and keeps its slice, so every rank
draws the same numbers and a TP model equals the serial one it was seeded
like (the price: the full weight's memory once, during construction).
Sharded parameters are ``ShardedParameter``s carrying ``tp_split_axis``,
which tells ``gather_state_dict`` how to reassemble them (and future tools,
e.g. a TP-aware gradient norm, which ones are sharded).
"""
from collections import OrderedDict

import numpy as np

from ... import distributed as dist
from ..._tensor import Tensor
from ... import functional as F
from ...nn import Linear, Module, Parameter
from ...random import fork_rng
from .collectives import copy_to_group, gather_from_group, reduce_from_group, scatter_to_group

TP_RNG_KEY = 1  # fork_rng key prefix of the tensor-parallel dropout streams


class ShardedParameter(Parameter):
    """This TP rank's slice of a larger parameter, split along ``tp_split_axis``.

    ``tp_split_groups`` > 1: the axis holds that many equal blocks (e.g. the
    q, k and v rows of an attention ``in_proj_weight``), each split over the
    ranks; rank t keeps slice t of every block, in block order."""

    __slots__ = ("tp_split_axis", "tp_split_groups")

    def __init__(self, data, tp_split_axis, tp_split_groups=1):
        super().__init__(data)
        self.tp_split_axis, self.tp_split_groups = tp_split_axis, tp_split_groups


def split_shard(full, axis, tp, t, groups=1):
    """Rank t's slice of ``full`` along ``axis`` (of each of ``groups`` blocks)."""
    shape = full.shape[:axis] + (groups, tp, -1) + full.shape[axis + 1:]
    part = full.reshape(shape)[(slice(None),) * axis + (slice(None), t)]
    return np.ascontiguousarray(part.reshape(full.shape[:axis] + (-1,) + full.shape[axis + 1:]))


def join_shards(parts, axis, groups=1):
    """The inverse of ``split_shard``: the full array from every rank's slice."""
    blocks = [np.split(p, groups, axis=axis) for p in parts]
    return np.concatenate([b[g] for g in range(groups) for b in blocks], axis=axis)


def _shard(full, axis, comm, layer, what, groups=1):
    """Rank t's slice t of ``full`` along ``axis``, ValueError if uneven."""
    tp, t = comm.Get_size(), comm.Get_rank()
    n = full.shape[axis]
    if n % (tp * groups):
        raise ValueError(f"{layer}: {what} {n // groups} is not divisible by the "
                         f"tensor-parallel size {tp}")
    return ShardedParameter(split_shard(full, axis, tp, t, groups), axis, groups)


def _full_linear_init(in_features, out_features, bias, dtype):
    """(weight, bias or None) as ``nn.Linear`` draws them (it draws them: the
    same init code, generator calls and rounding), so every rank draws the
    same numbers and a TP model equals the dense one seeded alike."""
    dense = Linear(in_features, out_features, bias=bias, dtype=dtype)
    return dense.weight.array, None if dense.bias is None else dense.bias.array


def check_comm(comm, layer):
    """The communicator of a layer's TP group ``comm``: a process group
    (``dist.new_group``; ValueError on a rank outside it) or a communicator
    (``mesh.tp``); TypeError for anything else."""
    if isinstance(comm, dist.ProcessGroup) or comm == dist.GroupMember.NON_GROUP_MEMBER:
        return dist.comm_of(comm, layer)
    if not hasattr(comm, "Get_size"):
        raise TypeError(f"{layer}: comm must be the tensor-parallel group: a process group "
                        f"(dist.new_group) or a communicator (e.g. mesh.tp), got "
                        f"{type(comm).__name__}")
    return comm


class TPModule(Module):
    """Base of tensor-parallel layers other than the linear ones: state-dict
    tools check that its ``tp_size`` is the mesh's."""

    tp_size = 1


class _ParallelLinear(Module):
    """What column and row layers share: sizes, the TP communicator, repr."""

    def __init__(self, in_features, out_features, comm):
        super().__init__()
        comm = check_comm(comm, type(self).__name__)
        self.in_features, self.out_features = in_features, out_features
        self.comm, self.tp_size = comm, comm.Get_size()

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, tp={self.tp_size}")


class ColumnParallelLinear(_ParallelLinear):
    """y = x @ W.T + b with W's rows (output features) split over ``comm``.

    The input is replicated; rank t computes output features
    ``[t*out/tp, (t+1)*out/tp)``. With ``gather_output`` the slices are
    all-gathered into the full, replicated output; without it the output
    stays split, ready for a ``RowParallelLinear(input_is_parallel=True)``.
    """

    def __init__(self, in_features, out_features, comm, bias=True, gather_output=False,
                 dtype=None):
        super().__init__(in_features, out_features, comm)
        self.gather_output = gather_output
        weight, full_bias = _full_linear_init(in_features, out_features, bias, dtype)
        name = "ColumnParallelLinear"
        self.weight = _shard(weight, 0, comm, name, "out_features")
        self.bias = None if not bias else _shard(full_bias, 0, comm, name, "out_features")

    def forward(self, x):
        y = F.linear(copy_to_group(x, self.comm), self.weight, self.bias)
        return gather_from_group(y, self.comm) if self.gather_output else y


class RowParallelLinear(_ParallelLinear):
    """y = x @ W.T + b with W's columns (input features) split over ``comm``.

    Rank t multiplies input slice t by its columns; one allreduce sums the
    partial products, and the replicated bias is added once, after it. With
    ``input_is_parallel=False`` the replicated input is sliced first.
    """

    def __init__(self, in_features, out_features, comm, bias=True, input_is_parallel=True,
                 dtype=None):
        super().__init__(in_features, out_features, comm)
        self.input_is_parallel = input_is_parallel
        weight, full_bias = _full_linear_init(in_features, out_features, bias, dtype)
        self.weight = _shard(weight, 1, comm, "RowParallelLinear", "in_features")
        self.bias = None if not bias else Parameter(full_bias)  # replicated, added once

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_group(x, self.comm)
        y = reduce_from_group(F.linear(x, self.weight), self.comm)
        return y if self.bias is None else y + self.bias


def _tp_rank(mesh_or_comm):
    rank = getattr(mesh_or_comm, "tp_rank", None)
    return mesh_or_comm.Get_rank() if rank is None else rank


def tp_rng_region(mesh_or_comm):
    """``with tp_rng_region(mesh):`` dropout (any spmdnet sampling) draws
    from a stream of its own per TP rank, so the ranks' slices of a split
    activation get independent masks; outside, every rank draws the same.
    Accepts a Mesh or the TP communicator."""
    return fork_rng((TP_RNG_KEY, _tp_rank(mesh_or_comm)))


class ParallelDropout(Module):
    """Dropout on a split activation: masks drawn inside ``tp_rng_region``."""

    def __init__(self, p, comm):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"ParallelDropout: p must be in [0, 1], got {p}")
        self.p, self.comm = p, comm

    def extra_repr(self):
        return f"p={self.p}"

    def forward(self, x):
        with tp_rng_region(self.comm):
            return F.dropout(x, self.p, self.training)


def _shard_table(model, mesh):
    """[(key, tensor, split axis or None)] in state_dict order; ValueError
    when a TP layer's group size is not the mesh's."""
    for name, mod in model.named_modules():
        if isinstance(mod, (_ParallelLinear, TPModule)) and mod.tp_size != mesh.tp_size:
            raise ValueError(f"{name or type(mod).__name__}: layer built for tp="
                             f"{mod.tp_size} but the mesh has tp={mesh.tp_size}")
    # _state_items: key -> tensor with tied entries under every name, as state_dict
    return [(k, t, getattr(t, "tp_split_axis", None), getattr(t, "tp_split_groups", 1))
            for k, t in model._state_items()]


def gather_state_dict(model, mesh):
    """The full, unsplit state_dict (a serial model's keys and shapes, host
    Tensors that are copies) on the mesh rank with tp_rank == dp_rank == 0
    (rank 0 when pp == 1); None on the others. Collective over every TP group
    of the mesh."""
    table = _shard_table(model, mesh)
    desc = [(k, tuple(t.shape), axis, groups) for k, t, axis, groups in table]
    dist.check_same(mesh.tp, desc, "gather_state_dict: TP ranks' (key, shard shape, axis)")
    if mesh.dp_rank != 0:  # the whole TP group agrees: only dp replica 0 gathers
        return None
    root = mesh.tp_rank == 0
    # host copies (PyTorch's full state dicts are copies too): the model trains on
    state = OrderedDict((k, t.numpy()) for k, t in model.state_dict().items())
    for key, _, axis, groups in table:
        if axis is None or mesh.tp_size == 1:
            continue
        local = np.ascontiguousarray(state[key])
        parts = np.empty((mesh.tp_size,) + local.shape, local.dtype) if root else None
        with dist.guarded(f"gather({key})", mesh.tp, local):
            mesh.tp.Gather(local, parts, root=0)
        if root:
            state[key] = join_shards(list(parts), axis, groups)
    return OrderedDict((k, Tensor(v)) for k, v in state.items()) if root else None


def _bcast_from_first(obj, mesh):
    """``obj`` of the rank with tp_rank == dp_rank == 0, on its whole stage."""
    with dist.guarded("broadcast(object)", mesh.dp):
        obj = mesh.dp.bcast(obj, root=0)
    with dist.guarded("broadcast(object)", mesh.tp):
        return mesh.tp.bcast(obj, root=0)


def _full_shape(t, axis, tp):
    shape = list(t.shape)
    if axis is not None:
        shape[axis] *= tp
    return tuple(shape)


def _state_problem(table, state, tp):
    """Why ``state`` does not fit the model's full shapes, or None."""
    if not isinstance(state, dict):
        return f"scatter_state_dict: expected a dict on rank 0, got {type(state).__name__}"
    want = {k: _full_shape(t, axis, tp) for k, t, axis, _ in table}
    missing = [k for k in want if k not in state]
    unexpected = [k for k in state if k not in want]
    bad = [f"{k}: state {tuple(np.shape(state[k]))} vs full model {want[k]}"
           for k in want if k in state and tuple(np.shape(state[k])) != want[k]]
    if missing or unexpected or bad:
        return (f"scatter_state_dict: missing keys {missing}, unexpected keys {unexpected}, "
                f"shape mismatches {bad}")
    return None


def scatter_state_dict(model, state, mesh):
    """Load a full, unsplit state_dict (a serial model's) into a TP model.

    ``state`` is read on the rank with tp_rank == dp_rank == 0 (rank 0 when
    pp == 1; other ranks may pass None); every rank keeps its slices. A
    state that does not fit raises ValueError on every rank."""
    table = _shard_table(model, mesh)
    root = mesh.tp_rank == 0 and mesh.dp_rank == 0
    problem = _bcast_from_first(_state_problem(table, state, mesh.tp_size) if root else None,
                                mesh)
    if problem:
        raise ValueError(problem)
    local = {}
    for key, t, axis, groups in table:
        full = np.empty(_full_shape(t, axis, mesh.tp_size), t.dtype)
        if root:
            full[...] = np.asarray(state[key])
        dist.bcast(full, root=0, comm=mesh.dp)
        dist.bcast(full, root=0, comm=mesh.tp)
        if axis is not None:
            full = split_shard(full, axis, mesh.tp_size, mesh.tp_rank, groups)
        local[key] = full
    model.load_state_dict(local)
