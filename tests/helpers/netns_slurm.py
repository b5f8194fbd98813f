"""A two-node Slurm on the two hosts of ``netns.TwoHosts``.

slurmctld and one slurmd run on host a, a second slurmd on host b, each under
its host's name; nodes are addressed by their link addresses, so every Slurm
message crosses (or stays inside) the namespaces. Each node offers fake GPUs
(character devices, as jobs/local-slurm does) so that the GPU job scripts are
scheduled unchanged and run on the CPU. The packages and munged come from
``jobs/local-slurm/start.sh --packages-only``; the munge socket is a file, seen
from every namespace. ``sbatch`` & co. must run inside a host (``cmd``): only
addresses inside the namespaces reach slurmctld.
"""
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers.launch import ROOT

START = ROOT / "jobs" / "local-slurm" / "start.sh"
CANNOT_START = 77
CPUS, GPUS = 16, 4
CONF = """\
ClusterName=spmdnet-2nodes
SlurmctldHost={a.hostname}({a.addr})
SlurmctldPort=6917
SlurmdPort=6918
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=pmi2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
MailProg=/bin/true
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
KillWait=5
MinJobAge=16
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
GresTypes=gpu
{nodes}
PartitionName=two Nodes={a.hostname},{b.hostname} Default=YES MaxTime=INFINITE State=UP \
OverSubscribe=FORCE:{cpus}
"""
# CPUs beyond the machine's cores (config_overrides): 2 ranks of 1 CPU per node need 2
NODE = ("NodeName={h.hostname} NodeAddr={h.addr} CPUs={cpus} RealMemory=1000 "
        "Gres=gpu:fake:{gpus} State=UNKNOWN")


class TwoNodeSlurm:
    def __init__(self, hosts, directory):
        self.hosts, self.dir = hosts, Path(directory)
        self.conf = self.dir / "slurm.conf"
        self.daemons, self.munged = [], None

    def install(self):
        """None when the packages are there and munged answers, else why not."""
        proc = subprocess.run([str(START), "--packages-only"], capture_output=True, text=True,
                              timeout=900, env=dict(os.environ, LOCAL_SLURM_DIR=str(self.dir)))
        if proc.returncode == CANNOT_START:
            return proc.stderr.strip() or "Slurm cannot be installed here"
        assert proc.returncode == 0, f"start.sh --packages-only:\n{proc.stdout}\n{proc.stderr}"
        pid_file = self.dir / "munged.pid"  # start.sh started munged: ours to stop
        self.munged = int(pid_file.read_text()) if pid_file.exists() else None
        return None

    def env(self, base):
        return dict(base, SLURM_CONF=str(self.conf))

    def cmd(self, host, argv):
        return self.hosts.argv(host, argv, keep_sys=True)

    def start(self, env, timeout=60):
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "state").mkdir(exist_ok=True)
        for h in self.hosts.hosts:
            (self.dir / f"spool-{h.hostname}").mkdir(exist_ok=True)
        gres = []
        for i in range(GPUS):
            dev = self.dir / f"fake-gpu{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # like /dev/null
        for h in self.hosts.hosts:
            gres.append(f"NodeName={h.hostname} Name=gpu Type=fake "
                        f"File={self.dir}/fake-gpu[0-{GPUS - 1}]")
        (self.dir / "gres.conf").write_text("\n".join(gres) + "\n")
        nodes = "\n".join(NODE.format(h=h, cpus=CPUS, gpus=GPUS) for h in self.hosts.hosts)
        self.conf.write_text(CONF.format(a=self.hosts.a, b=self.hosts.b, dir=self.dir,
                                         cpus=CPUS, nodes=nodes))
        env = self.env(env)
        log = open(self.dir / "daemons.out", "ab")  # noqa: SIM115 - kept open by the daemons
        self.daemons.append(subprocess.Popen(self.cmd(self.hosts.a, [
            "slurmctld", "-D", "-i", "-f", self.conf]), env=env, stdout=log, stderr=log))
        for h in self.hosts.hosts:
            self.daemons.append(subprocess.Popen(self.cmd(h, [
                "slurmd", "-D", "-N", h.hostname, "-f", self.conf]), env=env, stdout=log,
                stderr=log))
        deadline = time.monotonic() + timeout
        for _ in range(10 * timeout):
            states = self.states(env)
            if states and all(s.rstrip("*") in ("idle", "mixed") and not s.endswith("*")
                              for s in states.values()) and len(states) == 2:
                return states
            for p in self.daemons:
                assert p.poll() is None, f"a Slurm daemon exited {p.returncode}: " \
                                         f"{self.logs()}"
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        raise AssertionError(f"the two Slurm nodes are not idle after {timeout} s: "
                             f"{self.states(env)}\n{self.logs()}")

    def states(self, env):
        proc = subprocess.run(self.cmd(self.hosts.a, ["sinfo", "-h", "-N", "-o", "%N %T"]),
                              capture_output=True, text=True, env=self.env(env), timeout=20)
        return dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)

    def logs(self):
        return "\n".join(f"== {p.name}\n" + p.read_text()[-3000:]
                         for p in sorted(self.dir.glob("*.log")) + [self.dir / "daemons.out"]
                         if p.exists())

    def stop(self):
        for p in reversed(self.daemons):
            if p.poll() is None:
                p.terminate()
        for p in self.daemons:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        if self.munged is not None:
            try:
                os.kill(self.munged, signal.SIGTERM)
            except ProcessLookupError:
                pass
