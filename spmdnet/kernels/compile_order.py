"""Compiling into a cache that ranks share: rank 0 first, then one rank per
host, then the rest.

``compile_in_order`` serves any compile step that fills a disk cache (the
kernel cache, see ``spmdnet.kernels.warmup``). ``comm`` is duck-typed
(mpi4py-like: ``Get_rank``, ``Get_size``, ``allgather``, ``Barrier``), so
tests can pass a fake one, and this module needs nothing from
``spmdnet.distributed`` (a higher layer, which re-exports it as
``dist.compile_in_order``).
"""
import socket

from ..errors import DistributedError


def _rank_size(comm):
    rank = comm.Get_rank() if hasattr(comm, "Get_rank") else comm.rank
    size = comm.Get_size() if hasattr(comm, "Get_size") else comm.size
    return rank, size


def compile_in_order(compile_fn, comm=None, cache=None):
    """Call ``compile_fn()`` on every rank of ``comm`` and return its result.

    ``cache``: the directory that ``compile_fn`` fills and loads from, or
    None (no cache). Every rank of ``comm`` must call this. The ranks gather
    their host names and caches (ranks that disagree on the cache raise
    DistributedError on every rank). With a cache they take turns: rank 0
    compiles and fills the cache first; then the lowest rank of every other
    host (a node-local cache is filled once per host; a shared one is only
    read); then all other ranks, which load from the cache. Without one,
    every rank compiles at once: nothing is shared, so nothing can race."""
    if comm is None:
        return compile_fn()
    rank, size = _rank_size(comm)
    if size == 1:
        return compile_fn()
    everyone = comm.allgather((socket.gethostname(), cache))
    for other, (_, theirs) in enumerate(everyone):
        if theirs != everyone[0][1]:
            raise DistributedError(
                f"kernel cache settings differ between ranks: rank 0 has "
                f"{_describe(everyone[0][1])}, rank {other} has {_describe(theirs)} "
                f"(SPMDNET_KERNEL_CACHE, SPMDNET_CACHE_DIR)")
    if cache is None:
        return compile_fn()
    hosts = [host for host, _ in everyone]
    turn = 0 if rank == 0 else (1 if hosts.index(hosts[rank]) == rank else 2)
    result = None
    for phase in range(3):
        if phase == turn:
            result = compile_fn()
        (comm.Barrier if hasattr(comm, "Barrier") else comm.barrier)()
    return result


def _describe(cache):
    return "the cache off" if cache is None else f"the cache in {cache}"
