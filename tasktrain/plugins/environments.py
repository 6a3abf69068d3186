"""Lightning's cluster environments under their names (`from tasktrain.plugins.environments import
SLURMEnvironment`), for Trainer(plugins=[...]).

tasktrain reads who-is-who from the launcher's variables itself (tasktrain/strategies/environment.py: torchrun and
`tasktrain launch`, SLURM, its own launch), so an environment plugin states which launcher the run expects, and is
checked against the variables before training:

    LightningEnvironment()     the default: no external launcher, or torchrun-style variables (RANK, WORLD_SIZE,
                               LOCAL_RANK, MASTER_ADDR, MASTER_PORT); refused inside a SLURM job step. Its getters
                               are Lightning's (the class's docstring); the Trainer's strategy of several processes
                               holds one where no environment is given or detected, as Lightning's does
    TorchElasticEnvironment()  the processes were started by torchrun / `tasktrain launch`
    SLURMEnvironment(auto_requeue=True, requeue_signal=None)   SLURM; auto_requeue and requeue_signal are the
                               requeue settings of docs/slurm.md (TASKTRAIN_SLURM_REQUEUE / TASKTRAIN_REQUEUE_SIGNAL),
                               given in the script instead of the environment (the script's win)

A ClusterEnvironment of one's own (a subclass defined outside this module) is used as Lightning's DDP uses one: a
multi-process strategy calls its validate_settings(num_devices=, num_nodes=), starts the processes itself only where
its creates_processes_externally is False, then sets each rank with set_global_rank(node_rank() * devices +
local_rank()) and set_world_size(num_nodes * devices), and forms the process group at main_address:main_port with
its global_rank() and world_size() (tasktrain/strategies/world.py); teardown() at the end of each stage.

    KubeflowEnvironment()      Kubeflow's PyTorchJob (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK; one process a pod)
    LSFEnvironment()           LSF's jsrun (LSB_JOBID, LSB_DJOB_RANKFILE, JSM_NAMESPACE_SIZE / _RANK / _LOCAL_RANK)
    MPIEnvironment()           mpirun / mpiexec, through mpi4py (installed by the user; tests/test_mpi.py runs it
                               under MPICH's mpiexec)

read their cluster's variables as Lightning's do and give the ranks themselves: the Trainer drives the process group
from them as from a subclass of one's own. LSF and MPI are auto-detected as Lightning detects them (after torchrun's and
SLURM's variables). Lightning's XLAEnvironment is refused (no torch_xla), saying what to write instead.
"""
import abc
import importlib.util
import logging
import os
import signal
import socket
from typing import Optional

from tasktrain.strategies.environment import detect_environment, warn_if_srun_unused

log = logging.getLogger(__name__)

__all__ = ["ClusterEnvironment", "LightningEnvironment", "SLURMEnvironment", "TorchElasticEnvironment",
           "KubeflowEnvironment", "LSFEnvironment", "MPIEnvironment", "XLAEnvironment"]


class ClusterEnvironment(abc.ABC):
    """Lightning's base class. A subclass of one's own drives the process group (the module docstring); the
    defaults below read the launcher's variables, and the built-in subclasses say what they check."""

    def _environment(self):
        return detect_environment()

    @property
    def creates_processes_externally(self) -> bool:
        return self._environment().launcher not in (None, "self", "spawn")

    @property
    def main_address(self) -> str:
        return self._environment().main_address

    @property
    def main_port(self) -> int:
        return self._environment().main_port

    def world_size(self) -> int:
        return self._environment().world_size

    def global_rank(self) -> int:
        return self._environment().global_rank

    def local_rank(self) -> int:
        return self._environment().local_rank

    def node_rank(self) -> int:
        return self._environment().node_rank

    @staticmethod
    def detect() -> bool:
        return False

    def set_world_size(self, size: int) -> None:
        """Lightning's: the strategy's world size (num_nodes x devices), given before world_size() is read."""

    def set_global_rank(self, rank: int) -> None:
        """Lightning's: the strategy's rank (node_rank x devices + local_rank), given before global_rank() is read."""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Lightning's: raise when the Trainer's devices / num_nodes do not suit this environment."""

    def check(self, env):
        """Raise before training when the run's variables (`env`, a detected environment) are not this launcher's.
        (Not called for a subclass of one's own, which says where the processes are itself.)"""

    def teardown(self):
        pass


class LightningEnvironment(ClusterEnvironment):
    """Lightning's default, read as Lightning's is: the processes are the Trainer's own unless LOCAL_RANK is set
    (then a launcher of one's own started them: creates_processes_externally), the local and node rank from LOCAL_RANK
    and NODE_RANK / GROUP_RANK, and the global rank and world size the ones the strategy gives it (a multi-process
    strategy calls set_global_rank(node_rank * devices + local_rank) and set_world_size(num_nodes * devices) when the
    Trainer is built, as Lightning's do). The Trainer picks it where no environment is given and none is detected."""

    def __init__(self) -> None:
        self._main_port = -1
        self._global_rank = 0
        self._world_size = 1

    @property
    def creates_processes_externally(self) -> bool:
        return "LOCAL_RANK" in os.environ

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        if self._main_port == -1:  # (one free port, kept, where MASTER_PORT is not set: Lightning's rule)
            from tasktrain.strategies.launcher import find_free_port

            self._main_port = int(os.environ["MASTER_PORT"]) if "MASTER_PORT" in os.environ else find_free_port()
        return self._main_port

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        self._world_size = size

    def global_rank(self) -> int:
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank
        from tasktrain.trainer.runtime import announce_rank

        announce_rank(rank)  # (Lightning's sets rank_zero_only.rank too)

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", 0))

    def node_rank(self) -> int:
        return int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", 0)))

    def check(self, env):
        if env.launcher == "slurm":
            raise ValueError("plugins=[LightningEnvironment()] in a SLURM job step: tasktrain reads SLURM's variables "
                             "there (each srun task is a rank). Use SLURMEnvironment(), or leave the plugin out.")


class TorchElasticEnvironment(ClusterEnvironment):
    @staticmethod
    def detect() -> bool:
        return detect_environment(lightning=True).launcher == "torchrun"  # (Lightning's: TORCHELASTIC_RUN_ID set)

    def check(self, env):
        if env.launcher != "torchrun":
            raise ValueError("plugins=[TorchElasticEnvironment()]: this process was not started by torchrun or "
                             "`tasktrain launch` (RANK, WORLD_SIZE and LOCAL_RANK are not set). Launch with `torchrun "
                             "...` or `tasktrain launch ...`, or leave the plugin out.")


class SLURMEnvironment(ClusterEnvironment):
    """SLURM. auto_requeue=False: no save-and-requeue on the pre-emption signal (the signal's default action);
    requeue_signal: the signal that means pre-emption (default SIGUSR1). Outside a SLURM job nothing is installed."""

    def __init__(self, auto_requeue: bool = True, requeue_signal: Optional[signal.Signals] = None):
        self.auto_requeue = bool(auto_requeue)
        if requeue_signal is not None and not isinstance(requeue_signal, signal.Signals):
            try:
                requeue_signal = signal.Signals(requeue_signal)
            except ValueError:
                raise ValueError(f"SLURMEnvironment(requeue_signal={requeue_signal!r}): use a signal.Signals member, "
                                 "e.g. signal.SIGUSR2.") from None
        self.requeue_signal = signal.SIGUSR1 if requeue_signal is None else requeue_signal
        warn_if_srun_unused()  # (Lightning's constructor's hint)

    @staticmethod
    def detect() -> bool:
        warn_if_srun_unused()  # (Lightning's detect() gives it too)
        return detect_environment().launcher == "slurm"

    def check(self, env):
        if env.launcher not in ("slurm", None):
            raise ValueError(f"plugins=[SLURMEnvironment(...)]: the processes were started by {env.launcher!r}, not by "
                             "srun. Leave the plugin out (the launcher's variables are read), or launch with srun.")


class _GivesItsRanks(ClusterEnvironment):
    """An environment that reads its cluster's own variables and gives the ranks, world size, address and port itself:
    the Trainer drives the process group from its getters, as from a subclass of one's own (the module docstring).
    set_world_size / set_global_rank are ignored, as Lightning's are (the cluster decides)."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def set_world_size(self, size: int) -> None:
        log.debug("%s.set_world_size was called, but setting world size is not allowed. Ignored.", type(self).__name__)

    def set_global_rank(self, rank: int) -> None:
        log.debug("%s.set_global_rank was called, but setting global rank is not allowed. Ignored.", type(self).__name__)


class KubeflowEnvironment(_GivesItsRanks):
    """Kubeflow's PyTorchJob: one process per pod, its ranks from the operator's MASTER_ADDR, MASTER_PORT, WORLD_SIZE
    and RANK (local rank 0, node rank = RANK: give the Trainer devices=1, num_nodes=<pods>). Never auto-detected:
    pass it in plugins=[...] (detect() raises, as Lightning's)."""

    @property
    def main_address(self) -> str:
        return os.environ["MASTER_ADDR"]

    @property
    def main_port(self) -> int:
        return int(os.environ["MASTER_PORT"])

    @staticmethod
    def detect() -> bool:
        raise NotImplementedError("The Kubeflow environment can't be detected automatically.")

    def world_size(self) -> int:
        return int(os.environ["WORLD_SIZE"])

    def global_rank(self) -> int:
        return int(os.environ["RANK"])

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return self.global_rank()


def _jsrun_variable(name, what):
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"Cannot determine {what}. Environment variable `{name}` not found. Make sure you run your "
                         "executable with `jsrun`.")
    return int(value)


class LSFEnvironment(_GivesItsRanks):
    """IBM LSF with jsrun: world size, rank and local rank from JSM_NAMESPACE_SIZE / _RANK / _LOCAL_RANK; the hosts
    from the OpenMPI rank file LSB_DJOB_RANKFILE (its first line is the launch node, left out): the main address is
    the first compute host, the node rank this host's place among them; the port MASTER_PORT where set, else
    LSB_JOBID % 1000 + 10000 (every rank computes the same). Built, it sets MASTER_ADDR and MASTER_PORT (Lightning's
    constructor does). Auto-detected where LSB_JOBID, LSB_DJOB_RANKFILE, JSM_NAMESPACE_LOCAL_RANK and
    JSM_NAMESPACE_SIZE are set and neither torchrun's nor SLURM's variables are."""

    def __init__(self) -> None:
        hosts = self._read_hosts()
        rankfile = os.environ["LSB_DJOB_RANKFILE"]
        if not [host for host in hosts if host]:
            raise ValueError(f"LSF's rank file {rankfile} (LSB_DJOB_RANKFILE) lists no compute host after its first "
                             "line (the launch node): start the job with LSF's jsrun / bsub, which write it.")
        self._main_address = hosts[0]
        self._main_port = self._get_main_port()
        nodes = list(dict.fromkeys(hosts))  # unique hosts, in the rank file's order
        if socket.gethostname() not in nodes:
            raise ValueError(f"This host ({socket.gethostname()}) is not in LSF's rank file {rankfile} "
                             f"(LSB_DJOB_RANKFILE lists {', '.join(nodes)}): run it on the job's hosts, or give "
                             "the environment of the launcher that started this process.")
        self._node_rank = nodes.index(socket.gethostname())
        os.environ["MASTER_ADDR"] = str(self._main_address)
        os.environ["MASTER_PORT"] = str(self._main_port)

    @staticmethod
    def _read_hosts():
        rankfile = os.environ.get("LSB_DJOB_RANKFILE")
        if rankfile is None:
            raise ValueError("Did not find the environment variable `LSB_DJOB_RANKFILE`")
        if not rankfile:
            raise ValueError("The environment variable `LSB_DJOB_RANKFILE` is empty")
        with open(rankfile) as f:
            return [line.strip() for line in f][1:]  # (the first is the launch node)

    @staticmethod
    def _get_main_port() -> int:
        if "MASTER_PORT" in os.environ:
            return int(os.environ["MASTER_PORT"])
        if "LSB_JOBID" in os.environ:
            return int(os.environ["LSB_JOBID"]) % 1000 + 10000
        raise ValueError("Could not find job id in environment variable LSB_JOBID")

    @property
    def main_address(self) -> str:
        return self._main_address

    @property
    def main_port(self) -> int:
        return self._main_port

    @staticmethod
    def detect() -> bool:
        return {"LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE"} <= set(os.environ)

    def world_size(self) -> int:
        return _jsrun_variable("JSM_NAMESPACE_SIZE", "world size")

    def global_rank(self) -> int:
        return _jsrun_variable("JSM_NAMESPACE_RANK", "global rank")

    def local_rank(self) -> int:
        return _jsrun_variable("JSM_NAMESPACE_LOCAL_RANK", "local rank")

    def node_rank(self) -> int:
        return self._node_rank


def _mpi4py_installed() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


class MPIEnvironment(_GivesItsRanks):
    """Processes started by mpirun / mpiexec: ranks and world size from mpi4py's COMM_WORLD, the node rank this host's
    place among the sorted host names, the local rank within this host, the address rank 0's host name and the port a
    free one rank 0 picks (both broadcast over MPI). Needs mpi4py (not a tasktrain dependency: without it, building
    one raises ModuleNotFoundError, as Lightning's). Auto-detected where mpi4py is installed and MPI's world is larger
    than one, and neither torchrun's nor SLURM's nor LSF's variables are set. Every rank reads the getters in the same
    order (the first reads of the address, port and local / node rank are MPI collectives), as the Trainer does.

    Kept different from Lightning's: validate_settings raises where MPI's world is not the Trainer's devices x
    num_nodes, naming the numbers to pass (Lightning's trains a world of 1 on part of the data when the script was not
    started by mpiexec, and fails with an IndexError when mpiexec started more processes than asked)."""

    def __init__(self) -> None:
        if not _mpi4py_installed():
            raise ModuleNotFoundError("Requirement 'mpi4py' not met: MPIEnvironment reads the ranks from MPI through "
                                      "mpi4py. Install it (`pip install -U 'mpi4py'`), or use another environment.")
        from mpi4py import MPI

        self._comm_world = MPI.COMM_WORLD
        self._comm_local = None
        self._node_rank = None
        self._hosts = None  # every rank's host name, in rank order (read with the node rank)
        self._main_address = None
        self._main_port = None

    @property
    def main_address(self) -> str:
        if self._main_address is None:
            self._main_address = self._comm_world.bcast(socket.gethostname(), root=0)
        return self._main_address

    @property
    def main_port(self) -> int:
        if self._main_port is None:
            from tasktrain.strategies.launcher import find_free_port

            self._main_port = self._comm_world.bcast(find_free_port(), root=0)
        return self._main_port

    @staticmethod
    def detect() -> bool:
        if not _mpi4py_installed():
            return False
        try:
            from mpi4py import MPI  # (mpi4py may be installed without an MPI library)
        except ImportError:
            return False
        return MPI.COMM_WORLD.Get_size() > 1

    def world_size(self) -> int:
        return self._comm_world.Get_size()

    def global_rank(self) -> int:
        return self._comm_world.Get_rank()

    def local_rank(self) -> int:
        if self._comm_local is None:
            self._init_comm_local()
        return self._comm_local.Get_rank()

    def node_rank(self) -> int:
        if self._node_rank is None:
            self._init_comm_local()
        return self._node_rank

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        world = self.world_size()
        if world == num_devices * num_nodes:
            return
        if self._comm_local is None:
            self._init_comm_local()
        hosts = sorted(set(self._hosts))
        per_host = sorted({self._hosts.count(host) for host in hosts})
        asked = num_devices * num_nodes
        wanted = f"the Trainer asked for devices={num_devices} x num_nodes={num_nodes} = {asked}"
        processes = (f"{asked} processes ({num_devices} on each of {num_nodes} host(s)): `mpiexec -n {asked} python "
                     "script.py`")
        if world == 1:
            raise ValueError(f"MPIEnvironment(): MPI's world is this one process (it was not started by mpiexec / "
                             f"mpirun, or with -n 1), but {wanted}. Start {processes}, or leave the plugin out (the "
                             "Trainer then starts its processes itself).")
        if len(per_host) == 1:
            fix = f"pass devices={per_host[0]}, num_nodes={len(hosts)} to the Trainer"
        else:
            fix = f"start as many processes on every host, with devices x num_nodes = {world} in the Trainer"
        raise ValueError(f"MPIEnvironment(): mpiexec / mpirun started {world} processes on {len(hosts)} host(s) "
                         f"({', '.join(f'{host}: {self._hosts.count(host)}' for host in hosts)}), but {wanted}. "
                         f"Make them agree: {fix}, or start {processes}.")

    def _init_comm_local(self):
        hostname = socket.gethostname()
        hostnames = self._comm_world.gather(hostname, root=0)  # (None on the other ranks)
        self._hosts = self._comm_world.bcast(hostnames, root=0)
        self._node_rank = sorted(set(self._hosts)).index(hostname)
        self._comm_local = self._comm_world.Split(color=self._node_rank)


def detected_environment():
    """The environment Lightning's connector picks where none is given and neither torchrun's nor SLURM's variables
    are set (those tasktrain reads itself): LSF, then MPI; None otherwise."""
    for environment in (LSFEnvironment, MPIEnvironment):
        if environment.detect():
            return environment()
    return None


class _Refused(ClusterEnvironment):
    def __init__(self, *args, **kwargs):
        pass

    def check(self, env):
        raise ValueError(
            f"plugins=[{type(self).__name__}()]: tasktrain does not read this launcher's variables. Set the variables "
            "torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) from your cluster's, or launch "
            "with torchrun / `tasktrain launch` (docs/launch.md) or srun (docs/slurm.md), and leave the plugin out; "
            "or subclass ClusterEnvironment with your cluster's ranks (docs/lightning.md, Plugins).")


class XLAEnvironment(_Refused):
    pass
