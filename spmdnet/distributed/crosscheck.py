"""Collective check mode across communicators (``SPMDNET_DEBUG_COLLECTIVES=1``).

Checking each collective with an allgather on its own communicator hangs in
the very case it should report: rank A enters ``evaluate``'s allreduce on the
world while rank B waits in DataParallel's bucket allreduce on its private
communicator; each check waits for the other rank forever. Here the check is
point to point, on one private duplicate of the world: a rank entering a
collective on communicator C sends (communicator id, sequence number, op,
shape, dtype, call site) to every other member of C, then collects the
members' descriptors for that same collective.

- All arrive: they must agree on op, shape and dtype, else DistributedError
  on every member with the per-rank table.
- A member's descriptor for C has not come after ``GRACE_S``, but that member
  has announced another collective, on a communicator that includes this rank
  and that this rank has not entered: both ranks wait for each other (a
  deadlock under MPI's rules), and each raises DistributedError naming both
  collectives and call sites.
A member that announced nothing is busy elsewhere or in a collective of a
group this rank is not part of (another pipeline stage, another TP group, a
split communicator): never flagged; the watchdog names it if it never comes.
Communicators get a job-wide id when registered (``register``: a broadcast
from the communicator's rank 0, at creation for the world, DataParallel's and
Mesh's communicators, else at their first checked collective).
"""
import time

from ..errors import DistributedError
from ._mpi import mpi
from .guard import comm_label

TAG = 7010
GRACE_S = 1.0


class CrossCheck:
    def __init__(self, control, world):
        self.comm = control                 # a private Dup of the world
        self.world_group = world.Get_group()
        self.me = world.Get_rank()
        self.ids = {}                       # local handle -> (job-wide id, world ranks)
        self.count = 0
        self.inbox = {}                     # world rank -> its unmatched descriptors

    def register(self, comm):
        """Give ``comm`` a job-wide id (collective over ``comm``); idempotent."""
        key = comm.py2f()
        if key not in self.ids:
            self.count += 1
            gid = comm.bcast((self.me, self.count), root=0)
            members = tuple(comm.Get_group().Translate_ranks(list(range(comm.Get_size())),
                                                             self.world_group))
            self.ids[key] = (gid, None if mpi().UNDEFINED in members else members)
        return self.ids[key]

    def forget(self, comm):
        self.ids.pop(comm.py2f(), None)

    def _receive(self):
        MPI = mpi()
        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG, status=status):
            source = status.Get_source()
            self.inbox.setdefault(source, []).append(self.comm.recv(source=source, tag=TAG))

    def _take(self, member, gid):
        box = self.inbox.get(member, [])
        for i, desc in enumerate(box):
            if desc["id"] == gid:
                return box.pop(i)
        return None

    def check(self, comm, seq, op, shape, dtype, site):
        """Raise DistributedError unless every member of ``comm`` enters the same
        collective (see the module docstring); returns when they all do."""
        gid, members = self.register(comm)
        if members is None or len(members) == 1:
            return
        mine = {"id": gid, "seq": seq, "op": op, "shape": shape, "dtype": dtype,
                "site": site, "comm": comm_label(comm), "rank": comm.Get_rank()}
        requests = [self.comm.isend(mine, dest=m, tag=TAG) for m in members if m != self.me]
        got, since = {self.me: mine}, time.time()
        while len(got) < len(members):
            self._receive()
            for m in members:
                if m not in got:
                    desc = self._take(m, gid)
                    if desc is not None:
                        got[m] = desc
            if len(got) < len(members) and time.time() - since > GRACE_S:
                self._raise_if_elsewhere(mine, [m for m in members if m not in got])
            time.sleep(0.0005)
        mpi().Request.Waitall(requests)
        rows = [got[m] for m in members]
        key = [(d["seq"], d["op"], d["shape"], d["dtype"]) for d in rows]
        if all(k == key[0] for k in key):
            return
        table = "\n".join(f"  rank {d['rank']}: #{d['seq']} {d['op']} shape {d['shape']} "
                          f"dtype {d['dtype']} at {d['site']}" for d in rows)
        bad = next(d["rank"] for d, k in zip(rows, key) if k != key[0])
        raise DistributedError(f"collective mismatch on {mine['comm']}: rank {bad} differs "
                               f"from rank {rows[0]['rank']}\n{table}")

    def _raise_if_elsewhere(self, mine, missing):
        for m in missing:
            box = self.inbox.get(m)
            if not box:
                continue  # busy, or in a collective of a group without this rank
            other = box[-1]
            raise DistributedError(
                f"collective mismatch: rank {self.me} entered {mine['op']} #{mine['seq']} "
                f"on {mine['comm']} at {mine['site']}, but rank {m}, a member of that "
                f"communicator, is in {other['op']} #{other['seq']} on {other['comm']} at "
                f"{other['site']}, which rank {self.me} has not entered: the ranks wait "
                "for each other (different numbers of batches? a collective under a "
                "rank-dependent branch?)")
