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
- Point to point (``wait_p2p``, behind the pipeline's sends and receives):
  a rank waiting longer than ``ANNOUNCE_S`` for its peer tells that peer
  (and when the transfer is done, that it is done). A rank waiting in a
  collective whose missing member waits in a send or receive with this rank,
  and a rank waiting on a peer that has announced a collective this rank has
  not entered (or waits on this rank in a transfer that cannot match: both
  receiving, another tag), raise DistributedError naming both places:
  the pipeline stage that ran out of batches is reported within seconds.
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
ANNOUNCE_S = 0.1  # a point-to-point wait this long is announced to the peer


class CrossCheck:
    def __init__(self, control, world):
        self.comm = control                 # a private Dup of the world
        self.world_group = world.Get_group()
        self.me = world.Get_rank()
        self.ids = {}                       # local handle -> (job-wide id, world ranks)
        self.count = 0
        self.inbox = {}                     # world rank -> its unmatched descriptors
        self.p2p = {}                       # world rank -> the transfer it waits in, with us
        self.sends = []                     # announcements in flight
        self.peers = {}                     # (handle, rank in comm) -> world rank

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
        """A freed communicator: drop its id and the members' descriptors
        for it that no collective will match now (left by a reported mismatch)."""
        known = self.ids.pop(comm.py2f(), None)
        self.peers = {k: v for k, v in self.peers.items() if k[0] != comm.py2f()}
        if known is not None:
            for member, box in self.inbox.items():
                self.inbox[member] = [d for d in box if d["id"] != known[0]]

    def _receive(self):
        MPI = mpi()
        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG, status=status):
            source = status.Get_source()
            desc = self.comm.recv(source=source, tag=TAG)
            kind = desc.get("kind")
            if kind == "p2p":
                self.p2p[source] = desc
            elif kind == "p2p-done":
                self.p2p.pop(source, None)
            else:
                self.inbox.setdefault(source, []).append(desc)

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
                        self.p2p.pop(m, None)  # m is here: it waits in no transfer
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
            transfer = self.p2p.get(m)
            if not box and transfer is not None and transfer["peer"] == self.me:
                del self.p2p[m]  # reported: a later check must not see it again
                raise DistributedError(
                    f"collective mismatch: rank {self.me} entered {mine['op']} #{mine['seq']} "
                    f"on {mine['comm']} at {mine['site']}, but rank {m}, a member of that "
                    f"communicator, waits in {transfer['op']} with rank {self.me} on "
                    f"{transfer['comm']} at {transfer['site']}: the ranks wait for each "
                    "other (a pipeline stage with fewer batches than the others?)")
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

    # -- point to point --------------------------------------------------------------
    def world_rank(self, comm, rank):
        key = (comm.py2f(), rank)
        if key not in self.peers:  # a local translation: no collective, no registration
            self.peers[key] = comm.Get_group().Translate_ranks([rank], self.world_group)[0]
        return self.peers[key]

    def wait_p2p(self, comm, peer, op, direction, tag, done, site):
        """Poll ``done()`` (the transfer with ``peer``, a rank of ``comm``, can
        complete) until it is true; raise DistributedError when the peer waits
        for this rank elsewhere (see the module docstring)."""
        self.sends = [r for r in self.sends if not r.Test()]
        world_peer = self.world_rank(comm, peer)
        mine = {"kind": "p2p", "op": op, "direction": direction, "tag": tag,
                "peer": world_peer, "comm": comm_label(comm), "site": site}
        since, announced = time.time(), False
        try:
            while not done():
                self._receive()
                waited = time.time() - since
                if not announced and waited > ANNOUNCE_S:
                    announced = True
                    self.sends.append(self.comm.isend(mine, dest=world_peer, tag=TAG))
                if waited > GRACE_S:
                    self._raise_if_peer_elsewhere(mine, world_peer, peer)
                time.sleep(0.0005)
        except DistributedError:
            announced = False  # no "done": the peer still sees this wait, and reports it too
            raise
        finally:  # done: the peer must not take this wait for a current one
            if announced:
                self.sends.append(self.comm.isend({"kind": "p2p-done"}, dest=world_peer,
                                                  tag=TAG))

    def _raise_if_peer_elsewhere(self, mine, world_peer, peer):
        where = (f"rank {self.me} waits in {mine['op']} with rank {peer} of {mine['comm']} "
                 f"at {mine['site']}")
        box = self.inbox.get(world_peer)
        if box:
            other = box[-1]
            raise DistributedError(
                f"{where}, but that rank (world rank {world_peer}) is in {other['op']} "
                f"#{other['seq']} on {other['comm']} at {other['site']}, which rank {self.me} "
                "has not entered: the ranks wait for each other (a pipeline stage with "
                "fewer batches than the others? a collective under a rank-dependent branch?)")
        theirs = self.p2p.get(world_peer)
        if theirs is None or theirs["peer"] != self.me or theirs["comm"] != mine["comm"]:
            return
        pair = {mine["direction"], theirs["direction"]} == {"send", "recv"}
        if not pair or theirs["tag"] != mine["tag"]:
            del self.p2p[world_peer]  # reported: a later check must not see it again
            raise DistributedError(
                f"{where}, but that rank (world rank {world_peer}) waits in {theirs['op']} "
                f"with rank {self.me} at {theirs['site']}: the transfers cannot match, the "
                "ranks wait for each other")
