"""The stall watchdog: a thread that notices a collective waiting too long.

On by default: every rank runs the thread (``SPMDNET_WATCHDOG_S``, default
300 s; ``0`` turns it off). It answers "what are you doing?" queries from
other ranks on a private communicator, and watches only its own pending
collective (``guard.state``): work outside collectives (compiling, rank-0-only
data conversion) is never timed. Past the first limit it asks every rank and
prints one report naming the collective, its sequence number, the call site
and the ranks that have not arrived, with their hosts (a lost node is named)
and what they are doing; past
``SPMDNET_WATCHDOG_ABORT_S`` (default twice the first limit: 600 s, PyTorch's
collective timeout) it aborts the job with that report. It needs
MPI_THREAD_MULTIPLE (mpi4py asks for it); where MPI grants less, ``start``
warns once and the job runs unwatched.

When a peer process dies (its host lost, the network up), MPI's own calls may
stop returning: the network layer retries the lost connection inside every
progress call, the watchdog's included. A second thread, ``Deadline``, makes no
MPI call: past the abort limit, if the watchdog has been stuck in MPI for
``STUCK_S``, it ends this rank itself (``abort.exit_now``), naming the stalled
collective and the hosts of the ranks.
"""
import sys
import threading
import time

from . import guard
from ._mpi import mpi
from .abort import abort_job, exit_now

QUERY, REPLY = 7001, 7002
STUCK_S = 5.0  # the watchdog's own MPI call has not returned for this long: MPI is stuck
_thread = {}


def describe_state(rank, st):
    pending = st.get("pending")
    if st.get("exited") is not None:
        return f"rank {rank}: has left the program ({st['exited']})"
    if pending:
        return (f"rank {rank}: waiting in {pending['op']} #{pending['seq']} on "
                f"{pending['comm']} for {time.time() - pending['since']:.1f} s at "
                f"{pending['site']}")
    last = st.get("last")
    if last:
        return (f"rank {rank}: not in a collective; last finished {last['op']} "
                f"#{last['seq']} {time.time() - last['done']:.1f} s ago at {last['site']}")
    return f"rank {rank}: not in a collective; none finished yet"


def emit(rank, what, lines):
    """Write ``lines`` to stderr, each tagged ``[rank N] watchdog (what): ``; flushed."""
    text = "\n".join(f"[rank {rank}] watchdog ({what}): {line}" for line in lines)
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def answer_queries(comm):
    """Answer every pending "what are you doing?" query on ``comm``."""
    MPI = mpi()
    status = MPI.Status()
    while comm.Iprobe(source=MPI.ANY_SOURCE, tag=QUERY, status=status):
        comm.recv(source=status.Get_source(), tag=QUERY)
        comm.send(dict(guard.snapshot(), exited=_thread.get("exited")),
                  dest=status.Get_source(), tag=REPLY)


def query(comm, ranks, timeout=2.0):
    """{rank: state} of those of ``ranks`` whose watchdog answers within ``timeout``."""
    MPI = mpi()
    for r in ranks:
        comm.isend(None, dest=r, tag=QUERY)
    states, deadline = {}, time.time() + timeout
    status = MPI.Status()
    while len(states) < len(ranks) and time.time() < deadline:
        answer_queries(comm)
        if comm.Iprobe(source=MPI.ANY_SOURCE, tag=REPLY, status=status):
            states[status.Get_source()] = comm.recv(source=status.Get_source(), tag=REPLY)
        else:
            time.sleep(0.01)
    return states


def on_hosts(ranks, hosts):
    """``[2, 3] on host b`` (``hosts``: every rank's host name)."""
    names = sorted({hosts[r] for r in ranks}) if hosts else []
    if not names:
        return f"{ranks}"
    if len(names) == 1:
        return f"{ranks} on host {names[0]}"
    return f"{ranks} on hosts " + ", ".join(
        f"{n} ({[r for r in ranks if hosts[r] == n]})" for n in names)


class Watchdog(threading.Thread):
    def __init__(self, comm, limit_s, abort_s, poll_s=0.1, hosts=None):
        super().__init__(name="spmdnet-watchdog", daemon=True)
        self.comm, self.limit_s, self.abort_s, self.poll_s = comm, limit_s, abort_s, poll_s
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.hosts = hosts  # rank -> host name: a report names the lost node
        self.reported, self.late = None, None
        self.stopped = threading.Event()
        self.beat = time.time()  # the last time the loop was outside MPI

    def run(self):
        while not self.stopped.wait(self.poll_s):
            self.beat = time.time()
            answer_queries(self.comm)
            pending = guard.state["pending"]
            if pending is None:
                continue
            waited = time.time() - pending["since"]
            aborting = self.abort_s is not None and waited > self.abort_s
            if (waited > self.limit_s or aborting) and self.reported is not pending:
                self.reported = pending
                emit(self.rank, "stalled", self._report(guard.plain(pending), waited))
            if aborting:  # the stall report above named the late ranks
                site = guard.format_site(pending["site"])
                late = f"; ranks not in it: {on_hosts(self.late, self.hosts)}" if self.late \
                    else ""
                abort_job([f"watchdog (aborting the job): {pending['op']} #{pending['seq']} on "
                           f"{guard.comm_label(pending['comm'])} has waited {waited:.1f} s at "
                           f"{site}{late} (SPMDNET_WATCHDOG_ABORT_S={self.abort_s:g})"])

    def _report(self, pending, waited):
        """Ask every other rank for its state (2 s at most) and name the late ones."""
        others = [r for r in range(self.size) if r != self.rank]
        states = query(self.comm, others)
        states[self.rank] = guard.snapshot()
        late = [r for r in range(self.size)
                if r not in states or not _reached(states[r], pending)]
        self.late = late
        lines = [f"{pending['op']} #{pending['seq']} on {pending['comm']} has waited "
                 f"{waited:.1f} s at {pending['site']}; ranks not in it: "
                 f"{on_hosts(late, self.hosts)}"]
        host = (lambda r: f" on host {self.hosts[r]}") if self.hosts else (lambda r: "")
        lines += [describe_state(r, states[r]) if r in states else f"rank {r}{host(r)}: no "
                  "answer (busy, hung outside Python, or its host is lost)"
                  for r in range(self.size)]
        return lines


class Deadline(threading.Thread):
    """The abort that needs no MPI: see the module's docstring."""

    def __init__(self, watchdog, stuck_s=STUCK_S):
        super().__init__(name="spmdnet-watchdog-deadline", daemon=True)
        self.watchdog, self.stuck_s = watchdog, stuck_s

    def run(self):
        w = self.watchdog
        while not w.stopped.wait(w.poll_s):
            pending = guard.state["pending"]
            if pending is None or w.abort_s is None:
                continue
            now = time.time()
            waited, stuck = now - pending["since"], now - w.beat
            if waited > w.abort_s and stuck > self.stuck_s:
                exit_now(self.lines(pending, waited, stuck))

    def lines(self, pending, waited, stuck):
        w = self.watchdog
        where = ""
        if w.hosts:
            names = sorted(set(w.hosts), key=w.hosts.index)
            where = "; ranks by host: " + ", ".join(
                f"{n}: {[r for r, h in enumerate(w.hosts) if h == n]}" for n in names)
        late = f"; ranks not in it: {on_hosts(w.late, w.hosts)}" if w.late else ""
        return [f"watchdog (aborting the job): {pending['op']} #{pending['seq']} on "
                f"{guard.comm_label(pending['comm'])} has waited {waited:.1f} s at "
                f"{guard.format_site(pending['site'])}{late} "
                f"(SPMDNET_WATCHDOG_ABORT_S={w.abort_s:g}); MPI calls on this rank have not "
                f"returned for {stuck:.1f} s: a peer process or its host is likely lost"
                f"{where}"]


def _reached(st, pending):
    """Whether a rank in state ``st`` has reached the stalled collective
    ``pending``: it waits in it, or it has gone past it (a later number on the
    same communicator, same label and same members: a gather's or a
    send-side's non-root ranks leave before the root, so one rank's stall may
    find a healthy peer one call ahead)."""
    other = st.get("pending")
    if other is not None and all(other[k] == pending[k] for k in ("op", "seq", "comm")):
        return True
    if pending["seq"] == 0 or pending.get("members") is None:
        return False  # point-to-point (not numbered), or no members to tell comms apart
    for key, past in (("pending", 1), ("last", 0)):
        entry = st.get(key)
        if entry is not None and entry["comm"] == pending["comm"] \
                and entry.get("members") == pending["members"] \
                and entry["seq"] >= pending["seq"] + past:
            return True
    return False


def start(control, limit_s, abort_s, thread_multiple):
    """Start the watchdog once per process, on ``control`` (a private Dup of the
    world); warns and returns None where MPI did not grant MPI_THREAD_MULTIPLE."""
    if "thread" in _thread:
        return _thread["thread"]
    if not thread_multiple:
        if control.Get_rank() == 0:
            sys.stderr.write("[rank 0] spmdnet WARNING: the stall watchdog is off: it needs "
                             "MPI_THREAD_MULTIPLE, which this MPI did not grant (a hang "
                             "will not be reported; set SPMDNET_WATCHDOG_S=0 to silence "
                             "this)\n")
            sys.stderr.flush()
        return None
    # every rank's host, once: a stall report then names the node a lost rank was on
    hosts = control.allgather(mpi().Get_processor_name())
    _thread["thread"] = Watchdog(control, limit_s, abort_s, hosts=hosts)
    _thread["thread"].start()
    Deadline(_thread["thread"]).start()
    return _thread["thread"]


def running():
    return _thread.get("thread")


def mark_exited(what):
    """From now on, answer queries with "has left the program (what)"."""
    _thread["exited"] = what


def stop():
    """Stop the thread before MPI is finalized (idempotent)."""
    thread = _thread.pop("thread", None)
    if thread is not None:
        thread.stopped.set()
        if thread is not threading.current_thread():
            thread.join(timeout=5)
