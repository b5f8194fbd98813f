"""The stall watchdog: a thread that notices a collective waiting too long.

Every rank runs the thread (``SPMDNET_WATCHDOG_S``). It answers "what are you
doing?" queries from other ranks on a private communicator, and watches its
own pending collective (``guard.state``): past the first limit it asks every
rank and prints one report naming the collective, its sequence number, the
call site and the ranks that have not arrived (with what they are doing);
past the second limit it aborts the job with that report. It needs
MPI_THREAD_MULTIPLE, which mpi4py requests by default.
"""
import sys
import threading
import time

from . import guard
from ._mpi import mpi

QUERY, REPLY = 7001, 7002
_thread = {}


def _describe(rank, st):
    pending = st.get("pending")
    if pending:
        return (f"rank {rank}: waiting in {pending['op']} #{pending['seq']} on "
                f"{pending['comm']} for {time.time() - pending['since']:.1f} s at "
                f"{pending['site']}")
    last = st.get("last")
    if last:
        return (f"rank {rank}: not in a collective; last finished {last['op']} "
                f"#{last['seq']} {time.time() - last['done']:.1f} s ago at {last['site']}")
    return f"rank {rank}: not in a collective; none finished yet"


class Watchdog(threading.Thread):
    def __init__(self, comm, limit_s, abort_s, poll_s=0.1):
        super().__init__(name="spmdnet-watchdog", daemon=True)
        self.comm, self.limit_s, self.abort_s, self.poll_s = comm, limit_s, abort_s, poll_s
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.reported = None
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.wait(self.poll_s):
            self._answer_queries()
            pending = guard.state["pending"]
            if pending is None:
                continue
            waited = time.time() - pending["since"]
            if waited > self.limit_s and self.reported != pending["seq"]:
                self.reported = pending["seq"]
                self._emit(self._report(pending, waited), "stalled")
            if waited > self.abort_s:  # the stall report above named the late ranks
                self._emit([f"{pending['op']} #{pending['seq']} on {pending['comm']} has "
                            f"waited {waited:.1f} s at {pending['site']}"], "aborting the job")
                mpi().COMM_WORLD.Abort(1)

    def _answer_queries(self):
        MPI = mpi()
        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=QUERY, status=status):
            self.comm.recv(source=status.Get_source(), tag=QUERY)
            self.comm.send(dict(guard.state), dest=status.Get_source(), tag=REPLY)

    def _report(self, pending, waited):
        """Ask every other rank for its state (2 s at most) and name the late ones."""
        MPI = mpi()
        for r in range(self.size):
            if r != self.rank:
                self.comm.isend(None, dest=r, tag=QUERY)
        states, deadline = {self.rank: dict(guard.state)}, time.time() + 2.0
        status = MPI.Status()
        while len(states) < self.size and time.time() < deadline:
            self._answer_queries()
            if self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=REPLY, status=status):
                states[status.Get_source()] = self.comm.recv(source=status.Get_source(),
                                                             tag=REPLY)
            else:
                time.sleep(0.01)
        late = [r for r in range(self.size) if r not in states or not _in_same(states[r],
                                                                               pending)]
        lines = [f"{pending['op']} #{pending['seq']} on {pending['comm']} has waited "
                 f"{waited:.1f} s at {pending['site']}; ranks not in it: {late}"]
        lines += [_describe(r, states[r]) if r in states else f"rank {r}: no answer (busy "
                  "or hung outside Python)" for r in range(self.size)]
        return lines

    def _emit(self, lines, what):
        text = "\n".join(f"[rank {self.rank}] watchdog ({what}): {line}" for line in lines)
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def _in_same(st, pending):
    other = st.get("pending")
    return other is not None and other["op"] == pending["op"] and \
        other["seq"] == pending["seq"]


def start(comm, limit_s, abort_s):
    """Start the watchdog once per process (on a private Dup of ``comm``)."""
    if "thread" not in _thread:
        _thread["thread"] = Watchdog(comm.Dup(), limit_s, abort_s)
        _thread["thread"].start()
    return _thread["thread"]
