"""torch.distributed's collectives on picklable Python objects (mpi4py's
lower-case pickling collectives, guarded like every other call)."""
from .c10d import member
from .c10d_collectives import _root
from .guard import guarded


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Global rank ``src``'s ``object_list`` items into every member's list, in place."""
    pg = member(group, "broadcast_object_list")
    if pg is None:
        return None
    root = _root(pg, src, group_src, "src", "broadcast_object_list")
    with guarded(f"broadcast_object_list(root={root})", pg.comm):
        items = pg.comm.bcast(list(object_list) if pg.rank() == root else None, root=root)
    if len(items) != len(object_list):
        raise ValueError(f"broadcast_object_list: the source rank {pg.ranks[root]} sent "
                         f"{len(items)} objects, this rank's list has {len(object_list)}")
    object_list[:] = items
    return None


def all_gather_object(object_list, obj, group=None):
    """Every member's ``obj`` into ``object_list[r]`` (one slot per group rank)."""
    pg = member(group, "all_gather_object")
    if pg is None:
        return None
    if len(object_list) != pg.size():
        raise ValueError(f"all_gather_object: object_list has {len(object_list)} slots, "
                         f"the group has {pg.size()} ranks")
    with guarded("all_gather_object", pg.comm):
        object_list[:] = pg.comm.allgather(obj)
    return None


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    """Every member's ``obj`` into ``object_gather_list`` on global rank ``dst``."""
    pg = member(group, "gather_object")
    if pg is None:
        return None
    root = _root(pg, dst, group_dst, "dst", "gather_object")
    if pg.rank() == root and (object_gather_list is None
                              or len(object_gather_list) != pg.size()):
        raise ValueError(f"gather_object: the destination needs object_gather_list with "
                         f"{pg.size()} slots, got {object_gather_list!r}")
    with guarded(f"gather_object(root={root})", pg.comm):
        items = pg.comm.gather(obj, root=root)
    if pg.rank() == root:
        object_gather_list[:] = items
    return None


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None,
                        group=None, group_src=None):
    """Item r of global rank ``src``'s input list into ``scatter_object_output_list[0]``
    of group rank r."""
    pg = member(group, "scatter_object_list")
    if pg is None:
        return None
    root = _root(pg, src, group_src, "src", "scatter_object_list")
    if pg.rank() == root and (scatter_object_input_list is None
                              or len(scatter_object_input_list) != pg.size()):
        raise ValueError(f"scatter_object_list: the source needs {pg.size()} objects, "
                         f"got {scatter_object_input_list!r}")
    if len(scatter_object_output_list) < 1:
        raise ValueError("scatter_object_list: the output list needs one slot")
    with guarded(f"scatter_object_list(root={root})", pg.comm):
        scatter_object_output_list[0] = pg.comm.scatter(
            list(scatter_object_input_list) if pg.rank() == root else None, root=root)
    return None


__all__ = ["broadcast_object_list", "all_gather_object", "gather_object",
           "scatter_object_list"]
