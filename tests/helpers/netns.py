"""Two hosts on one machine: two network namespaces joined by a private veth link.

Each host is a network namespace (its own loopback and one veth end, ``IFACE``,
with an address of ``SUBNET``) and, for every process started on it, a fresh UTS
namespace with the host's own hostname. Nothing outside the two namespaces is
touched: the veth pair is created directly inside them, the root namespace gets
no address or route, so traffic can only flow between the two namespaces.

MPI between the hosts: ``mpiexec`` runs on host A and enters host B through
``netns_launcher.sh`` (hydra's ssh launcher pointed at a script, no daemon),
with MPICH's OFI netmod on libfabric's tcp provider bound to ``IFACE``. pip's
MPICH would otherwise pick UCX, which sees one machine and moves the data
through shared memory, never over the link.

Names carry ``PREFIX`` and the owning pid, so a crashed run's namespaces are
found and removed by the next run (``clean_stale``).
"""
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "spmdnet-mn"
IFACE = "mn0"  # the same name in both namespaces: one FI_TCP_IFACE for every rank
SUBNET = "10.231.7"  # /24; only inside the namespaces
LAUNCHER = Path(__file__).with_name("netns_launcher.sh")
HOSTS_ENV = "NETNS_HOSTS"  # addr=netns=hostname,... for the launcher
TCP_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": IFACE}


def _ip(*args, check=True, timeout=20):
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} exited {proc.returncode}: "
                           f"{proc.stderr.strip()}")
    return proc


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def unavailable():
    """Why two hosts cannot be made here (one line), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (iproute2 / util-linux) to make the hosts"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    try:
        uts = subprocess.run(["ip", "netns", "exec", probe, "unshare", "--uts", "--",
                              "hostname", "probe"], capture_output=True, text=True, timeout=20)
        if uts.returncode != 0:
            return f"cannot give a namespace its own hostname: {uts.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def namespaces():
    """The names of this machine's network namespaces that carry ``PREFIX``."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.strip() and line.split()[0].startswith(PREFIX + "-")]


def pids(netns):
    """The pids of the processes in ``netns``."""
    return [int(p) for p in _ip("netns", "pids", netns, check=False).stdout.split()]


def kill_all_in(netns, timeout=10.0):
    """SIGKILL every process in ``netns``; waits (bounded) until none is left.
    Returns the pids killed."""
    killed = []
    deadline = time.monotonic() + timeout
    for _ in range(100):
        left = pids(netns)
        if not left or time.monotonic() > deadline:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return killed


def clean_stale():
    """Remove the namespaces a crashed earlier run left (owner pid gone)."""
    removed = []
    for netns in namespaces():
        parts = netns[len(PREFIX) + 1:].split("-")
        if parts and parts[0].isdigit() and _pid_alive(int(parts[0])):
            continue
        kill_all_in(netns)
        _ip("netns", "del", netns, check=False)
        removed.append(netns)
    return removed


@dataclass(frozen=True)
class Host:
    hostname: str
    netns: str
    addr: str


class TwoHosts:
    """Hosts ``a`` and ``b``: ``up()`` makes them, ``down()`` removes them and
    everything running in them."""

    def __init__(self, tag="h"):
        base = f"{PREFIX}-{os.getpid()}-{tag}"
        self.a = Host(f"mnode-{tag}-a", f"{base}-a", f"{SUBNET}.1")
        self.b = Host(f"mnode-{tag}-b", f"{base}-b", f"{SUBNET}.2")
        self.hosts = (self.a, self.b)

    def up(self):
        try:
            for h in self.hosts:
                _ip("netns", "add", h.netns)
            _ip("link", "add", IFACE, "netns", self.a.netns, "type", "veth",
                "peer", "name", IFACE, "netns", self.b.netns)
            for h in self.hosts:
                # IPv4 only: libfabric's tcp provider would also try the link's IPv6
                # address, which is unusable ("tentative") for its first second or two
                _ip("netns", "exec", h.netns, "sh", "-c",
                    f"f=/proc/sys/net/ipv6/conf/{IFACE}/disable_ipv6; [ ! -e $f ] || echo 1 >$f")
                _ip("-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", IFACE)
                _ip("-n", h.netns, "link", "set", "lo", "up")
                _ip("-n", h.netns, "link", "set", IFACE, "up")
            self._wait_link_up()
        except BaseException:
            self.down()
            raise
        return self

    def _wait_link_up(self, timeout=10.0):
        # MPI started before both ends are up finds no usable address on IFACE
        deadline = time.monotonic() + timeout
        for _ in range(1000):
            states = [self._link(h)["operstate"] for h in self.hosts]
            if states == ["UP", "UP"]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the link {IFACE} is not up after {timeout:g} s: {states}")
            time.sleep(0.02)

    def _link(self, host):
        return json.loads(_ip("-j", "-s", "-n", host.netns, "link", "show", IFACE).stdout)[0]

    def down(self):
        for h in self.hosts:
            kill_all_in(h.netns)
            _ip("netns", "del", h.netns, check=False)  # takes the veth pair with it

    def argv(self, host, argv, keep_sys=False):
        """``argv`` run on ``host``: in its network namespace, with its hostname.
        ``keep_sys``: see the machine's /sys (with its cgroups, which slurmd needs)
        instead of the namespace's own sysfs that ``ip netns exec`` mounts."""
        enter = (["nsenter", f"--net=/run/netns/{host.netns}"] if keep_sys
                 else ["ip", "netns", "exec", host.netns])
        return [*enter, "unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"',
                host.hostname, *map(str, argv)]

    def env(self, base=None):
        """``base`` (os.environ) plus what the launcher and MPICH need to run
        ranks on both hosts over TCP."""
        env = dict(os.environ if base is None else base, **TCP_ENV)
        env[HOSTS_ENV] = ",".join(f"{h.addr}={h.netns}={h.hostname}" for h in self.hosts)
        return env

    def mpiexec_argv(self, mpiexec, per_host, argv):
        """mpiexec on host a with ``per_host`` ranks on each host (a's first)."""
        hosts = ",".join(f"{h.addr}:{per_host}" for h in self.hosts)
        return self.argv(self.a, [mpiexec, "-launcher", "ssh", "-launcher-exec",
                                  str(LAUNCHER), "-localhost", self.a.addr, "-hosts", hosts,
                                  "-n", str(2 * per_host), *argv])

    def mpiexec_argv_on(self, mpiexec, host, n, argv):
        """mpiexec on ``host`` with all ``n`` ranks there, launched as
        ``mpiexec_argv`` launches them: the job without the other host."""
        return self.argv(host, [mpiexec, "-launcher", "ssh", "-launcher-exec", str(LAUNCHER),
                                "-localhost", host.addr, "-hosts", f"{host.addr}:{n}",
                                "-n", str(n), *argv])

    def link_bytes(self):
        """Bytes sent and received so far on host a's end of the link."""
        stats = self._link(self.a)["stats64"]
        return stats["tx"]["bytes"] + stats["rx"]["bytes"]

    def kill_host(self, host):
        return kill_all_in(host.netns)

    def link_down(self, host):
        _ip("-n", host.netns, "link", "set", IFACE, "down")

    def link_up(self, host):
        _ip("-n", host.netns, "link", "set", IFACE, "up")
        self._wait_link_up()

    def cap_bandwidth(self, rate):
        """Cap both directions of the link at ``rate`` (tc's spelling: "1gbit")
        with a token bucket; returns None, or why it cannot be done here."""
        if shutil.which("tc") is None:
            return "no `tc` command (iproute2)"
        for h in self.hosts:
            proc = subprocess.run(["ip", "netns", "exec", h.netns, "tc", "qdisc", "replace",
                                   "dev", IFACE, "root", "tbf", "rate", rate, "burst", "64kb",
                                   "latency", "100ms"], capture_output=True, text=True,
                                  timeout=20)
            if proc.returncode != 0:
                self.uncap()
                return f"tc tbf: {proc.stderr.strip() or proc.returncode}"
        return None

    def uncap(self):
        for h in self.hosts:
            subprocess.run(["ip", "netns", "exec", h.netns, "tc", "qdisc", "del", "dev", IFACE,
                            "root"], capture_output=True, timeout=20)
