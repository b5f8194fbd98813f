"""dist.Mesh: the Megatron layout (tp fastest, then dp, then pp), group
isolation checked with collectives, errors on every rank, freeing."""
import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as sn
from spmdnet import dist

pytestmark = pytest.mark.mpi

LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2), (3, 1), (4, 1), (1, 4)]


@pytest.fixture(autouse=True)
def world():
    return dist.init()


def coordinates(size, tp, pp):
    """Oracle: world rank -> (pp, dp, tp) by enumerating the grid in
    Megatron's order (tp varies fastest), independent of Mesh's arithmetic."""
    dp, table = size // (tp * pp), {}
    for p in range(pp):
        for d in range(dp):
            for t in range(tp):
                table[len(table)] = (p, d, t)
    return table


def members(table, rank, axis):
    """World ranks sharing every coordinate of ``rank`` except ``axis``."""
    mine = table[rank]
    keep = [i for i in range(3) if i != axis]
    return [r for r, c in table.items() if all(c[i] == mine[i] for i in keep)]


def layout_or_skip(tp, pp):
    if dist.size() % (tp * pp):
        pytest.skip(f"tp*pp={tp * pp} does not divide {dist.size()} ranks")


@pytest.mark.parametrize("tp,pp", LAYOUTS)
def test_coordinates_and_sizes(tp, pp):
    layout_or_skip(tp, pp)
    size, rank = dist.size(), dist.rank()
    with dist.Mesh(tp=tp, pp=pp) as mesh:
        p, d, t = coordinates(size, tp, pp)[rank]
        assert (mesh.pp_rank, mesh.dp_rank, mesh.tp_rank) == (p, d, t)
        assert (mesh.tp_size, mesh.dp_size, mesh.pp_size) == (tp, size // (tp * pp), pp)
        assert (mesh.tp.Get_size(), mesh.dp.Get_size(), mesh.pp.Get_size()) == \
            (tp, size // (tp * pp), pp)
        assert mesh.coords() == (p, d, t)


@pytest.mark.parametrize("tp,pp", LAYOUTS)
def test_group_isolation(tp, pp):
    """Allreduce of the world rank within each group gives that group's own
    sum; allgather gives exactly its members, in rank order."""
    layout_or_skip(tp, pp)
    table, rank = coordinates(dist.size(), tp, pp), dist.rank()
    with dist.Mesh(tp=tp, pp=pp) as mesh:
        for axis, comm in ((2, mesh.tp), (1, mesh.dp), (0, mesh.pp)):
            group = members(table, rank, axis)
            total = dist.allreduce(np.array([rank], np.int64), comm=comm)
            assert total[0] == sum(group)
            assert comm.allgather(rank) == group


def test_tp_ranks_are_adjacent():
    layout_or_skip(2, 1)
    with dist.Mesh(tp=2) as mesh:
        ranks = mesh.tp.allgather(dist.rank())
        assert ranks[1] - ranks[0] == 1 and ranks[0] % 2 == 0


def test_dp_is_world_when_tp_is_one():
    with dist.Mesh() as mesh:
        assert mesh.dp.allgather(dist.rank()) == list(range(dist.size()))
        assert mesh.tp.Get_size() == mesh.pp.Get_size() == 1


@pytest.mark.parametrize("tp,pp", [(None, 1), (2, 1), (1, 3)])
def test_bad_sizes_raise_on_every_rank(tp, pp):
    size = dist.size()
    tp = size + 1 if tp is None else tp  # never divides the world size
    if size % (tp * pp) == 0:
        pytest.skip(f"tp*pp={tp * pp} divides {size} ranks")
    with pytest.raises(ValueError) as info:
        dist.Mesh(tp=tp, pp=pp)
    msg = str(info.value)
    assert f"tp={tp}" in msg and f"pp={pp}" in msg and f"world size {size}" in msg
    raised = MPI.COMM_WORLD.allreduce(1)  # every rank got here by raising
    assert raised == size


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", True])
def test_invalid_values_raise(bad):
    with pytest.raises(ValueError, match="tp must be a positive integer"):
        dist.Mesh(tp=bad)


def test_ranks_disagreeing_on_the_layout_raise_on_every_rank():
    if dist.size() < 2:
        pytest.skip("needs two ranks")
    with pytest.raises(sn.DistributedError, match=r"Mesh \(tp, pp\)"):
        dist.Mesh(tp=1 if dist.rank() == 0 else 2)


def test_free_releases_the_groups():
    mesh = dist.Mesh()
    mesh.free()
    assert mesh.tp is None and mesh.dp is None and mesh.pp is None
    mesh.free()  # idempotent


def test_mesh_over_a_given_communicator():
    with dist.Mesh(comm=MPI.COMM_SELF) as mesh:
        assert (mesh.size, mesh.tp_rank, mesh.dp_rank) == (1, 0, 0)
        assert dist.allreduce(np.array([dist.rank()]), comm=mesh.dp)[0] == dist.rank()
