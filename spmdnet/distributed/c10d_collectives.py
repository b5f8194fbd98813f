"""torch.distributed's collectives on tensors, over MPI communicators.

In place on the given tensors (spmdnet Tensors, NumPy or CuPy arrays),
PyTorch's signatures and errors; ``src``/``dst`` are global ranks whatever
the group; a rank outside ``group`` returns None at once (PyTorch's
warning). Each call goes through ``guarded`` (sequence numbers, the check
mode, the stall watchdog); device buffers are staged as in ``collectives``.
``async_op=True`` returns a completed ``Work`` (see ``c10d_p2p``).

Each function has PyTorch's one signature. spmdnet's own collectives on
arrays and communicators have names of their own (``collectives``:
``allreduce``, ``allgather``, ``bcast``, ``reduce_scatter_block``;
``runtime.comm_barrier``), so nothing here guesses which API it was called
with.
"""
import numpy as np

from .. import backend
from ._mpi import mpi
from .c10d import ReduceOp, as_reduce_op, member
from .agreement import agree
from .c10d_p2p import completed
from .collectives import (ReduceTypeError, bcast, integer_average, on_host, tensor_array,
                          to_host)
from .guard import guarded

_MPI_OPS = {ReduceOp.SUM: "SUM", ReduceOp.AVG: "SUM", ReduceOp.PRODUCT: "PROD",
            ReduceOp.MIN: "MIN", ReduceOp.MAX: "MAX", ReduceOp.BAND: "BAND",
            ReduceOp.BOR: "BOR", ReduceOp.BXOR: "BXOR"}


def _mpi_op(op, dtype, what):
    """MPI's op for a ReduceOp on ``dtype``; PyTorch's dtype rules raise."""
    op = as_reduce_op(op)
    if op is ReduceOp.AVG and np.dtype(dtype).kind not in "fc":
        raise integer_average(f"{what}(op=ReduceOp.AVG)", dtype)
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and np.dtype(dtype).kind not in "iub":
        raise ReduceTypeError(f"{what}: cannot use ReduceOp.{op.name} with non-integral "
                              f"dtype {dtype}")
    return op, getattr(mpi(), _MPI_OPS[op])


def _average(arr, op, size):
    if op is ReduceOp.AVG and size > 1:
        arr /= size


def _root(pg, rank, group_rank, name, what):
    """The group rank of a global ``rank`` (PyTorch's default: rank 0)."""
    if group_rank is not None:
        if not 0 <= group_rank < pg.size():
            raise ValueError(f"{what}: group_{name} {group_rank} is outside the group of "
                             f"{pg.size()} ranks")
        return group_rank
    return pg.group_rank(0 if rank is None else rank, f"{what}: {name}")


def _same(arrays, shape, dtype, what, name):
    for i, a in enumerate(arrays):
        if tuple(a.shape) != tuple(shape) or a.dtype != dtype:
            raise ValueError(f"{what}: {name}[{i}] has shape {tuple(a.shape)} dtype {a.dtype}, "
                             f"expected shape {tuple(shape)} dtype {dtype}")


def _list(tensors, size, what, name):
    if tensors is None or len(tensors) != size:
        got = "None" if tensors is None else f"{len(tensors)} tensors"
        raise ValueError(f"{what}: {name} must hold one tensor per rank of the group "
                         f"({size}), got {got}")
    return [tensor_array(t, what) for t in tensors]


def _root_list(pg, root, tensors, like, what, name, role):
    """The arrays of ``tensors`` (one per group rank, each shaped as
    ``like``) on the root, None elsewhere; PyTorch raises where a rank
    that is not the root (the ``role`` rank) gives a list."""
    if pg.rank() == root:
        arrays = _list(tensors, pg.size(), what, f"{name} on the {role} rank")
        _same(arrays, like.shape, like.dtype, what, name)
        return arrays
    if tensors:
        raise ValueError(f"{what}: {name} must not be given on rank {pg.ranks[pg.rank()]}, "
                         f"which is not the {role} {pg.ranks[root]}")
    return None


def _check_holds(what, whole, whole_name, block, block_name, size):
    """``whole`` must hold ``size`` blocks of ``block``'s elements, of its dtype."""
    if whole.size != block.size * size or whole.dtype != block.dtype:
        raise ValueError(f"{what}: {whole_name} shape {tuple(whole.shape)} dtype "
                         f"{whole.dtype} must hold {size} x {block_name} shape "
                         f"{tuple(block.shape)} dtype {block.dtype}")


def _stacked(arrays, like):
    return backend.xp_of(like).stack(arrays) if arrays else like


def _done(async_op, *tensors):
    return completed(*tensors) if async_op else None


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``tensor`` over the group, in place on every member."""
    pg = member(group, "all_reduce")
    if pg is None:
        return None
    arr = tensor_array(tensor, "all_reduce")
    op, mpi_op = _mpi_op(op, arr.dtype, "all_reduce")
    with guarded(f"all_reduce({op.name})", pg.comm, arr):
        agree(pg.comm, "allreduce", arr, op.name.lower())
        on_host(arr, lambda buf: pg.comm.Allreduce(mpi().IN_PLACE, buf, mpi_op))
    _average(arr, op, pg.size())
    return _done(async_op, tensor)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """Reduce ``tensor`` over the group into global rank ``dst``'s tensor
    (the other ranks' tensors are left as they were)."""
    pg = member(group, "reduce")
    if pg is None:
        return None
    root = _root(pg, dst, group_dst, "dst", "reduce")
    arr = tensor_array(tensor, "reduce")
    op, mpi_op = _mpi_op(op, arr.dtype, "reduce")
    with guarded(f"reduce({op.name}, root={root})", pg.comm, arr):
        agree(pg.comm, "reduce", arr, f"{op.name.lower()} to {pg.ranks[root]}")
        if pg.rank() == root:
            on_host(arr, lambda buf: pg.comm.Reduce(mpi().IN_PLACE, buf, mpi_op, root=root))
        else:
            pg.comm.Reduce(to_host(arr), None, mpi_op, root=root)
    if pg.rank() == root:
        _average(arr, op, pg.size())
    return _done(async_op, tensor)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None, *, root=None,
              comm=None):
    """Global rank ``src``'s tensor into every member's, in place; returns
    None, or a Work with ``async_op`` (PyTorch's).

    spmdnet's own spelling, ``broadcast(x, root=0, comm=None)`` (the public
    contract since the first release), is the keyword form of ``dist.bcast``:
    ``root=``/``comm=`` or no source at all (which PyTorch refuses) broadcast
    an array or any object over a communicator and return it."""
    if root is not None or comm is not None or (src is None and group_src is None):
        if src is not None or group is not None or group_src is not None or async_op:
            raise TypeError("broadcast: give PyTorch's src=/group= or spmdnet's "
                            f"root=/comm=, not both (src={src}, group_src={group_src}, "
                            f"root={root})")
        return bcast(tensor, 0 if root is None else root, comm)
    pg = member(group, "broadcast")
    if pg is None:
        return None
    source = _root(pg, src, group_src, "src", "broadcast")
    arr = tensor_array(tensor, "broadcast")
    with guarded(f"broadcast(root={source})", pg.comm, arr):
        agree(pg.comm, "broadcast", arr, f"from {pg.ranks[source]}")
        on_host(arr, lambda buf: pg.comm.Bcast(buf, root=source))
    return _done(async_op, tensor)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """Every member's ``tensor`` into ``tensor_list[r]`` (one per group rank)."""
    pg = member(group, "all_gather")
    if pg is None:
        return None
    arr = tensor_array(tensor, "all_gather")
    outs = _list(tensor_list, pg.size(), "all_gather", "tensor_list")
    _same(outs, arr.shape, arr.dtype, "all_gather", "tensor_list")
    gathered = backend.xp_of(arr).empty((pg.size(),) + tuple(arr.shape), arr.dtype)
    send = to_host(arr)
    with guarded("all_gather", pg.comm, arr):
        agree(pg.comm, "allgather", arr)
        on_host(gathered, lambda buf: pg.comm.Allgather(send, buf))
    for out, part in zip(outs, gathered):
        out[...] = part
    return _done(async_op, *tensor_list)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """Members' inputs concatenated (or stacked) along dim 0 of ``output_tensor``."""
    pg = member(group, "all_gather_into_tensor")
    if pg is None:
        return None
    arr, out = tensor_array(input_tensor, "all_gather_into_tensor"), \
        tensor_array(output_tensor, "all_gather_into_tensor")
    _check_holds("all_gather_into_tensor", out, "output", arr, "input", pg.size())
    send = to_host(arr)
    with guarded("all_gather_into_tensor", pg.comm, arr):
        on_host(out, lambda buf: pg.comm.Allgather(send, buf))
    return _done(async_op, output_tensor)


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    """Every member's ``tensor`` into ``gather_list`` on global rank ``dst``."""
    pg = member(group, "gather")
    if pg is None:
        return None
    root = _root(pg, dst, group_dst, "dst", "gather")
    arr = tensor_array(tensor, "gather")
    is_root = pg.rank() == root
    outs = _root_list(pg, root, gather_list, arr, "gather", "gather_list", "destination")
    send = to_host(arr)
    with guarded(f"gather(root={root})", pg.comm, arr):
        if is_root:
            gathered = np.empty((pg.size(),) + tuple(arr.shape), arr.dtype)
            pg.comm.Gather(send, gathered, root=root)
        else:
            pg.comm.Gather(send, None, root=root)
    if is_root:
        for out, part in zip(outs, gathered):
            out[...] = backend.xp_of(out).asarray(part)
    return _done(async_op, tensor)


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    """``scatter_list[r]`` of global rank ``src`` into group rank r's ``tensor``."""
    pg = member(group, "scatter")
    if pg is None:
        return None
    root = _root(pg, src, group_src, "src", "scatter")
    arr = tensor_array(tensor, "scatter")
    ins = _root_list(pg, root, scatter_list, arr, "scatter", "scatter_list", "source")
    send = None if ins is None else to_host(_stacked(ins, arr))
    with guarded(f"scatter(root={root})", pg.comm, arr):
        on_host(arr, lambda buf: pg.comm.Scatter(send, buf, root=root))
    return _done(async_op, tensor)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002 - PyTorch's name
    """The reduction of ``input`` over the group, block r (of dim 0) to rank r."""
    pg = member(group, "reduce_scatter_tensor")
    if pg is None:
        return None
    arr, out = tensor_array(input, "reduce_scatter_tensor"), \
        tensor_array(output, "reduce_scatter_tensor")
    _check_holds("reduce_scatter_tensor", arr, "input", out, "output", pg.size())
    op, mpi_op = _mpi_op(op, arr.dtype, "reduce_scatter_tensor")
    send = to_host(arr)
    with guarded(f"reduce_scatter_tensor({op.name})", pg.comm, arr):
        on_host(out, lambda buf: pg.comm.Reduce_scatter_block(send, buf, mpi_op))
    _average(out, op, pg.size())
    return _done(async_op, output)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """``output`` of group rank r gets the reduction of every member's
    ``input_list[r]`` (spmdnet's block reduce-scatter of one array over a
    communicator is ``dist.reduce_scatter_block``)."""
    pg = member(group, "reduce_scatter")
    if pg is None:
        return None
    out = tensor_array(output, "reduce_scatter")
    ins = _list(input_list, pg.size(), "reduce_scatter", "input_list")
    _same(ins, out.shape, out.dtype, "reduce_scatter", "input_list")
    reduce_scatter_tensor(out, _stacked(ins, out), op, pg)
    return _done(async_op, output)


def _counts(sizes):
    """MPI's (counts, displacements) for blocks of ``sizes`` elements."""
    sizes = [int(n) for n in sizes]
    return sizes, [int(d) for d in np.cumsum([0] + sizes[:-1])]


def _all_to_all(out, recv_sizes, arr, send_sizes, pg, what):
    """Alltoallv of the flat ``arr`` in blocks of ``send_sizes`` elements into
    ``out`` in blocks of ``recv_sizes``."""
    send, send_counts, recv_counts = to_host(arr), _counts(send_sizes), _counts(recv_sizes)
    with guarded(what, pg.comm):
        on_host(out, lambda buf: pg.comm.Alltoallv([send, send_counts], [buf, recv_counts]))


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    """``input_tensor_list[r]`` of every rank into ``output_tensor_list[s]`` of
    rank r (s: the sender); sizes may differ per pair."""
    pg = member(group, "all_to_all")
    if pg is None:
        return None
    outs = _list(output_tensor_list, pg.size(), "all_to_all", "output_tensor_list")
    ins = _list(input_tensor_list, pg.size(), "all_to_all", "input_tensor_list")
    dtypes = {str(a.dtype) for a in outs + ins}
    if len(dtypes) != 1:
        raise ValueError(f"all_to_all: every tensor needs one dtype, got {sorted(dtypes)}")
    xp = backend.xp_of(ins[0])
    flat_in = xp.concatenate([a.reshape(-1) for a in ins])
    flat_out = xp.empty(sum(int(a.size) for a in outs), outs[0].dtype)
    _all_to_all(flat_out, [a.size for a in outs], flat_in, [a.size for a in ins], pg,
                "all_to_all")
    start = 0
    for out in outs:
        out[...] = flat_out[start:start + out.size].reshape(out.shape)
        start += out.size
    return _done(async_op, *output_tensor_list)


def _splits(arr, sizes, size, name):
    rows = arr.shape[0] if arr.ndim else 1
    if sizes is None:
        if rows % size:
            raise ValueError(f"all_to_all_single: dim 0 of {name} ({rows}) is not divisible "
                             f"by the {size} ranks; give {name}_split_sizes")
        sizes = [rows // size] * size
    if len(sizes) != size or sum(sizes) != rows:
        raise ValueError(f"all_to_all_single: {name}_split_sizes {list(sizes)} must have "
                         f"{size} entries summing to dim 0 ({rows})")
    row = arr.size // max(rows, 1)
    return [int(s) * row for s in sizes]


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,  # noqa: A002
                      group=None, async_op=False):
    """Rows of ``input`` (split by ``input_split_sizes``, default equal) to the
    ranks in order; ``output`` takes the rows every rank sent here, in rank order."""
    pg = member(group, "all_to_all_single")
    if pg is None:
        return None
    arr, out = tensor_array(input, "all_to_all_single"), tensor_array(output,
                                                                      "all_to_all_single")
    if arr.dtype != out.dtype:
        raise ValueError(f"all_to_all_single: input dtype {arr.dtype} != output {out.dtype}")
    ins = _splits(arr, input_split_sizes, pg.size(), "input")
    outs = _splits(out, output_split_sizes, pg.size(), "output")
    _all_to_all(out, outs, arr, ins, pg, "all_to_all_single")
    return _done(async_op, output)


def barrier(group=None, async_op=False, device_ids=None):
    """Wait until every member of ``group`` (a ProcessGroup, None: the
    default group) has arrived. spmdnet's barrier over an mpi4py
    communicator is ``dist.comm_barrier(comm)``."""
    pg = member(group, "barrier")
    if pg is None:
        return None
    with guarded("barrier", pg.comm):
        pg.comm.Barrier()
    return _done(async_op)


__all__ = ["all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
           "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
           "all_to_all_single", "barrier"]
