"""A real SLURM cluster on this machine for tests/test_slurm.py: munged, slurmctld and two slurmd, all started in one
temporary folder and stopped by pid. Debian's SLURM 22.05 (`make setup` installs it as root).

The two nodes are the host's own name and `localhost`: both resolve to this machine (the first name of a job's
node list becomes MASTER_ADDR, so a made-up name would leave torch retrying its lookup forever)."""
import os
import shutil
import signal
import socket
import subprocess
import time

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "salloc", "scontrol", "squeue", "scancel")
START_TIMEOUT = 60.0


def missing_programs():
    paths = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [p for p in PROGRAMS if shutil.which(p, path=paths) is None]


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Cluster:
    def __init__(self, root):
        self.root = str(root)
        self.procs = []
        self.host = socket.gethostname()
        self.nodes = [self.host, "localhost"] if self.host != "localhost" else ["localhost", "127.0.0.1"]
        self.conf = os.path.join(self.root, "slurm.conf")
        self.munge_socket = os.path.join(self.root, "munge", "munge.socket")
        self.env = dict(os.environ, SLURM_CONF=self.conf,
                        PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")

    def _log(self, name):
        return open(os.path.join(self.root, "log", name + ".out"), "ab")

    def _spawn(self, name, argv):
        # SIGPIPE stays ignored in the daemons, as systemd starts them (IgnoreSIGPIPE=yes). SLURM's message send
        # sets SIGPIPE to ignored and back around each write, process-wide: with SIGPIPE at its default, two threads
        # of slurmd launching steps at once can restore the default under each other, and a write to a closed socket
        # then kills slurmd without a word (seen in CI: five jobs' steps at once, slurmd gone, srun exit 141).
        # Python ignores SIGPIPE; restore_signals=False keeps that for the child, its slurmstepd and the jobs.
        proc = subprocess.Popen(argv, stdout=self._log(name), stderr=subprocess.STDOUT, env=self.env,
                                start_new_session=True, restore_signals=False)
        self.procs.append((name, proc))
        return proc

    def start(self):
        for sub in ("munge", "log", "state", "spool"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        os.chmod(os.path.join(self.root, "munge"), 0o700)
        key = os.path.join(self.root, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        ctld_port, port_a, port_b = _free_ports(3)
        with open(self.conf, "w") as f:
            f.write(self._config(ctld_port, port_a, port_b))
        self._spawn("munged", ["munged", "-F", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={self.root}/munge/munged.pid", f"--log-file={self.root}/log/munged.log",
                               f"--seed-file={self.root}/munge/munged.seed"])
        self._wait(lambda: os.path.exists(self.munge_socket), "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
        self._wait(lambda: self.run(["scontrol", "ping"], check=False).stdout.count("UP") > 0, "slurmctld")
        for node in self.nodes:
            self._spawn("slurmd-" + node, ["slurmd", "-D", "-N", node, "-f", self.conf])
        self._wait(self._nodes_idle, "both slurmd to register as idle")
        return self

    def _config(self, ctld_port, port_a, port_b):
        root = self.root
        a, b = self.nodes
        return f"""ClusterName=tasktrain
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
InactiveLimit=0
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=60
Waittime=0
NodeName={a} NodeAddr=127.0.0.1 Port={port_a} CPUs=8 Sockets=1 CoresPerSocket=8 ThreadsPerCore=1 State=UNKNOWN
NodeName={b} NodeAddr=127.0.0.1 Port={port_b} CPUs=8 Sockets=1 CoresPerSocket=8 ThreadsPerCore=1 State=UNKNOWN
PartitionName=debug Nodes={a},{b} Default=YES MaxTime=10 State=UP OverSubscribe=NO
"""

    def _nodes_idle(self):
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split()
        states = dict(zip(out[0::2], out[1::2]))
        return all(states.get(n, "").startswith("idle") for n in self.nodes)

    def _wait(self, ready, what):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode} while waiting for {what}:\n"
                                       + self.logs())
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {START_TIMEOUT} s waiting for {what}:\n" + self.logs())

    def logs(self):
        text = []
        for name in sorted(os.listdir(os.path.join(self.root, "log"))):
            with open(os.path.join(self.root, "log", name), errors="replace") as f:
                text.append(f"--- {name}\n" + f.read()[-3000:])
        return "\n".join(text)

    def run(self, argv, timeout=60, check=True, **kwargs):
        env = dict(self.env, **kwargs.pop("env", {}))
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)
        if check and result.returncode != 0:
            raise RuntimeError(f"{argv} exited with {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def stop(self):
        """Every job cancelled, then every daemon by its pid: slurmd first, then slurmctld, then munged; last, any
        job step daemon (slurmstepd, which outlives slurmd by design) this cluster's slurmd started, with its tasks."""
        controller = dict(self.procs).get("slurmctld")
        if controller is not None and controller.poll() is None:
            self.run(["scancel", "--partition=debug"], check=False, timeout=30)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.run(["squeue", "-h"], check=False, timeout=30).stdout.strip():
                time.sleep(0.5)
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=15)
        self.procs = []
        for pid in self._step_daemons():
            for task in _descendants(pid) + [pid]:
                try:
                    os.kill(task, signal.SIGKILL)
                except OSError:
                    pass

    def _step_daemons(self):
        """The slurmstepd processes of this cluster: they carry its SLURM_CONF from the slurmd that forked them."""
        mine = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if not f.read().startswith(b"slurmstepd"):
                        continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mine in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
        return found


def _descendants(pid):
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
