"""Lightning's cluster environments under their names (`from tasktrain.plugins.environments import
SLURMEnvironment`), for Trainer(plugins=[...]).

tasktrain reads who-is-who from the launcher's variables itself (tasktrain/strategies/environment.py: torchrun and
`tasktrain launch`, SLURM, its own launch), so an environment plugin states which launcher the run expects, and is
checked against the variables before training:

    LightningEnvironment()     the default: no external launcher, or torchrun-style variables (RANK, WORLD_SIZE,
                               LOCAL_RANK, MASTER_ADDR, MASTER_PORT); refused inside a SLURM job step
    TorchElasticEnvironment()  the processes were started by torchrun / `tasktrain launch`
    SLURMEnvironment(auto_requeue=True, requeue_signal=None)   SLURM; auto_requeue and requeue_signal are the
                               requeue settings of docs/slurm.md (TASKTRAIN_SLURM_REQUEUE / TASKTRAIN_REQUEUE_SIGNAL),
                               given in the script instead of the environment (the script's win)

A ClusterEnvironment of one's own (a subclass defined outside this module) is used as Lightning's DDP uses one: a
multi-process strategy calls its validate_settings(num_devices=, num_nodes=), starts the processes itself only where
its creates_processes_externally is False, then sets each rank with set_global_rank(node_rank() * devices +
local_rank()) and set_world_size(num_nodes * devices), and forms the process group at main_address:main_port with
its global_rank() and world_size() (tasktrain/strategies/world.py); teardown() at the end of each stage.
Lightning's Kubeflow / LSF / MPI / XLA environments are refused, saying what to write instead (set the variables
torchrun sets, or launch with torchrun / `tasktrain launch`).
"""
import abc
import signal

from tasktrain.strategies.environment import detect_environment, warn_if_srun_unused

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
    @staticmethod
    def detect() -> bool:
        return True

    def check(self, env):
        if env.launcher == "slurm":
            raise ValueError("plugins=[LightningEnvironment()] in a SLURM job step: tasktrain reads SLURM's variables "
                             "there (each srun task is a rank). Use SLURMEnvironment(), or leave the plugin out.")


class TorchElasticEnvironment(ClusterEnvironment):
    @staticmethod
    def detect() -> bool:
        return detect_environment().launcher == "torchrun"

    def check(self, env):
        if env.launcher != "torchrun":
            raise ValueError("plugins=[TorchElasticEnvironment()]: this process was not started by torchrun or "
                             "`tasktrain launch` (RANK, WORLD_SIZE and LOCAL_RANK are not set). Launch with `torchrun "
                             "...` or `tasktrain launch ...`, or leave the plugin out.")


class SLURMEnvironment(ClusterEnvironment):
    """SLURM. auto_requeue=False: no save-and-requeue on the pre-emption signal (the signal's default action);
    requeue_signal: the signal that means pre-emption (default SIGUSR1). Outside a SLURM job nothing is installed."""

    def __init__(self, auto_requeue=True, requeue_signal=None):
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


class _Refused(ClusterEnvironment):
    def __init__(self, *args, **kwargs):
        pass

    def check(self, env):
        raise ValueError(
            f"plugins=[{type(self).__name__}()]: tasktrain does not read this launcher's variables. Set the variables "
            "torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) from your cluster's, or launch "
            "with torchrun / `tasktrain launch` (docs/launch.md) or srun (docs/slurm.md), and leave the plugin out; "
            "or subclass ClusterEnvironment with your cluster's ranks (docs/lightning.md, Plugins).")


class KubeflowEnvironment(_Refused):
    pass


class LSFEnvironment(_Refused):
    pass


class MPIEnvironment(_Refused):
    pass


class XLAEnvironment(_Refused):
    pass
