"""The world of several processes: one torch.distributed process group per process, joined or started.

A capability the multi-process strategies (DDP, DeepSpeed, FSDP) inherit beside Strategy, as the one-process ones
inherit OneProcess, through ParallelStrategy (parallel.py, Lightning's name of ProcessWorld + Strategy):
`class FSDP(Sharded, ParallelStrategy)`. It is the world only (who starts the processes,
ranks, the process group, the watchdog, the collectives, the end of the group); how a strategy wraps the module,
steps and saves is its own.

Who starts the processes:
- nobody (plain `python train.py`): rank 0 re-runs the same command for ranks 1..N-1 (launcher.py), or, with
  start_method="spawn", strategy.launch spawns N children and waits for them (spawn.py);
- torchrun, `tasktrain launch` or SLURM: every process joins the world those launchers describe.

The process group lives as long as the process: `trainer.fit(...)` then `trainer.test(...)` in one script use
the same group (the other ranks run the same script, so they reach the same calls). Teardown order (gloo can abort
at interpreter exit otherwise, see FINDINGS): each stage's teardown first drops what the strategy built over the
group (wrappers, engines: the strategy's own teardown, before it calls ProcessWorld.teardown), then a world of one
ends its group at once; a larger world's group is destroyed at exit, after a gc and a bounded rendezvous of every
rank, and rank 0 then waits for the workers it started.
"""
import atexit
import gc
import json
import os
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from tasktrain.accelerators.accelerator import Accelerator
from tasktrain.strategies.base import MultiProcess, check_gather_group, lightning_reduce_op, release_kept_runs
from tasktrain.strategies.environment import (ClusterEnvironment, SlurmAllocationError, detect_environment,
                                              environment_from_local_rank, environment_from_plugin,
                                              refuse_unstarted_slurm_tasks)
from tasktrain.strategies.watchdog import checked_collective, start_watchdog, stop_watchdog

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

# One process group per process, created by the first multi-process strategy that needs it and shared by later ones.
_PROCESS = {"owns_group": False, "exit_hook": False, "error_hook": False, "launcher": None}


class ProcessWorld(MultiProcess):
    """Several processes over one process group: the core's world (ranks, collectives) for a multi-process
    strategy. A mixin placed before Strategy; its arguments are the strategy's own:

    Args:
        process_group_backend: "gloo" or "nccl"; default nccl on CUDA, gloo on CPU.
        timeout: how long a collective may wait for the other ranks (a timedelta or seconds) before it fails.
            A rank that dies is noticed sooner: see the failure notes in docs/distributed.md.
        start_method: "popen" re-runs the command for the other ranks; "spawn" starts them with
            torch.multiprocessing (the module and loaders must then be picklable).
    """

    def __init__(self, accelerator: Optional[Accelerator] = None, precision=None, process_group_backend=None,
                 timeout=timedelta(minutes=30), start_method="popen"):
        super().__init__(accelerator=accelerator, precision=precision)
        if start_method not in ("popen", "spawn"):
            fork = (" (Lightning's 'fork' is not: children forked from a running interpreter hang once it ran "
                    "multi-threaded ops; in a notebook, run the fit in a function with notebook_launcher)"
                    if start_method == "fork" else "")
            raise ValueError(f"{type(self).__name__} start_method must be 'popen' (re-run the command) or 'spawn', "
                             f"got {start_method!r}{fork}.")
        if process_group_backend not in (None, "gloo", "nccl"):
            raise ValueError(f"{type(self).__name__} process_group_backend={process_group_backend!r}: use 'gloo', "
                             "'nccl' or None (auto).")
        self.process_group_backend = process_group_backend
        self.timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))
        self.start_method = start_method
        self.env = None

    def configure_processes(self, process_group_backend=None, timeout=None, ddp_kwargs=None):
        """Accelerate's InitProcessGroupKwargs; ddp_kwargs are the strategy's to take or refuse (it overrides)."""
        if process_group_backend is not None:
            if process_group_backend not in ("gloo", "nccl"):
                raise ValueError(f"process group backend {process_group_backend!r}: use 'gloo' or 'nccl'.")
            self.process_group_backend = process_group_backend
        if timeout is not None:
            self.timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))

    _idle_launcher = None  # the launcher view of a strategy whose workers are not started (yet), made when read
    # How the launcher's variables are read (environment.detect_environment): True under Lightning's Trainer (set by
    # the Trainer's build_runtime), where RANK / WORLD_SIZE / LOCAL_RANK without torchrun are a launcher of one's own
    # (ranks from LOCAL_RANK and the node rank); False under the Accelerator, which reads RANK as Accelerate does.
    lightning_ranks = False

    @property
    def launcher(self):
        """Lightning's strategy.launcher: the object that starts the workers from a plain `python script.py`, as
        Lightning's DDP strategies always have one. The SubprocessLauncher of this process's self-launched workers
        once they run; before (or with a world of one, where nothing is started) one not started; where a launcher
        outside started the processes (torchrun, SLURM, `tasktrain launch`, a user's ClusterEnvironment that creates
        them, a LOCAL_RANK-only launch, or this process is a worker) one that starts nothing (no procs, its launch()
        refused), as Lightning's _SubprocessScriptLauncher does there; start_method="spawn": a SpawnLauncher
        (spawn.py), in the parent and in its children. Its `is_interactive_compatible` is False, as Lightning's for
        these start methods."""
        if _PROCESS["launcher"] is not None:
            return _PROCESS["launcher"]
        if self.start_method == "spawn":
            if self._idle_launcher is None:
                from tasktrain.strategies.spawn import SpawnLauncher

                self._idle_launcher = SpawnLauncher(self.devices)
            return self._idle_launcher
        external = self._launched_by() is not None  # (read each time: the environment decides, not the first read)
        if self._idle_launcher is None or self._idle_launcher.external != external:
            from tasktrain.strategies.launcher import SubprocessLauncher

            self._idle_launcher = SubprocessLauncher(self.devices, self.num_nodes, external=external)
        return self._idle_launcher

    # -- who am I ------------------------------------------------------------------------------------------
    def _launched_by(self):
        """Who started this process: the launcher's variables (environment.py), or "external" where the user's
        ClusterEnvironment plugin says its cluster creates the processes (Lightning's creates_processes_externally:
        then nothing is started here)."""
        plugin = self.environment_plugin
        if plugin is not None and plugin.creates_processes_externally:
            return "external"
        launcher = detect_environment(lightning=self.lightning_ranks).launcher
        if launcher is None and environment_from_local_rank(self.devices, self.num_nodes, meeting=False,
                                                            lightning=self.lightning_ranks):
            return "external"  # a launcher of one's own set LOCAL_RANK only (Lightning's LightningEnvironment)
        return launcher

    def _environment(self):
        """This rank's place in the world: the launcher's variables, or the user's ClusterEnvironment plugin."""
        if self.environment_plugin is None:
            return environment_from_local_rank(self.devices, self.num_nodes, lightning=self.lightning_ranks) or \
                detect_environment(lightning=self.lightning_ranks)
        return environment_from_plugin(self.environment_plugin, self.devices, self.num_nodes)

    def set_world_ranks(self):
        """Lightning's DDP set_world_ranks at its construction: set_global_rank(node_rank() * devices + local_rank()),
        then set_world_size(num_nodes * devices) on the user's environment (the same calls again at set-up)."""
        plugin = self.environment_plugin
        if plugin is not None:
            plugin.set_global_rank(int(plugin.node_rank()) * self.devices + int(plugin.local_rank()))
            plugin.set_world_size(self.num_nodes * self.devices)

    def _place(self):
        """This rank's place as known now: the world's once set up; before that (right after Trainer(...)), what a
        launcher's variables say (torchrun / `tasktrain launch`, SLURM, a self-launched worker), as Lightning's
        strategy knows its ranks once constructed, or what a ClusterEnvironment plugin of one's own says now (its
        getters, as Lightning's strategy reads them); None where nobody launched this process (it is rank 0 of the
        world it will start). Only variables are read: no process group forms here."""
        if self.env is not None:
            return self.env
        plugin = self.environment_plugin
        if plugin is not None:
            return ClusterEnvironment(global_rank=plugin.global_rank(), world_size=plugin.world_size(),
                                      local_rank=plugin.local_rank(), node_rank=plugin.node_rank())
        try:
            env = detect_environment(lightning=self.lightning_ranks)
        except SlurmAllocationError:  # raised by the set-up, where the run starts
            return None
        if env.launcher is None:  # (LOCAL_RANK alone: Lightning's ranks from it)
            return environment_from_local_rank(self.devices, self.num_nodes, meeting=False,
                                               lightning=self.lightning_ranks)
        return env

    @property
    def global_rank(self):
        place = self._place()
        return place.global_rank if place else 0

    @property
    def local_rank(self):
        place = self._place()
        return place.local_rank if place else 0

    @property
    def node_rank(self):
        place = self._place()
        return place.node_rank if place else 0

    @property
    def world_size(self):
        place = self._place()
        return place.world_size if place else self.devices * self.num_nodes

    def configure(self, accelerator=None, devices=1, num_nodes=1, precision=None):
        super().configure(accelerator, devices, num_nodes, precision)
        # Checked here, before any process starts, so every rank fails alike and at once.
        if self.process_group_backend == "nccl" and self.accelerator_name == "cpu":
            raise ValueError("process_group_backend='nccl' needs CUDA devices; use 'gloo' (the default) on CPU.")

    # -- lifecycle -----------------------------------------------------------------------------------------
    def needs_launch(self) -> bool:
        """Nobody started the other ranks, and more than one is asked for."""
        return self._launched_by() is None and self.devices * self.num_nodes > 1

    def launch(self, run, *args):
        """start_method="spawn" starts the ranks here with torch.multiprocessing (spawn.py), a world of one too (its
        one rank trains in a child, as under Lightning's _MultiProcessingLauncher, so what a spawned child does
        differently, such as the DataLoader warnings of the "spawn" start method, happens alike); "popen" runs `run`
        in this process, which re-runs the script for the other ranks in setup_environment."""
        if self.start_method == "spawn" and self._launched_by() is None:
            from tasktrain.strategies.spawn import run_spawned

            return run_spawned(self, run, args)
        return run(*args)

    def setup_environment(self):
        # An earlier run's kept engine (DeepSpeed's, for a save after its run) goes before this run starts, and with a
        # world of one its group: this run then starts or joins its own.
        release_kept_runs()
        if self.max_restarts:  # issue 29
            from tasktrain.strategies.launcher import check_restarts, run_under_elastic_agent

            if self.needs_launch():
                run_under_elastic_agent(self.devices * self.num_nodes, self.max_restarts, self.num_nodes)
            check_restarts(self.max_restarts)
        plugin = self.environment_plugin
        if plugin is not None:  # Lightning's launchers ask the user's environment first, on every process
            plugin.validate_settings(num_devices=self.devices, num_nodes=self.num_nodes)
        if self.needs_launch():
            if plugin is not None:  # the workers meet where the user's environment says (as Lightning's launcher)
                os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = plugin.main_address, str(plugin.main_port)
                os.environ["NODE_RANK"] = str(plugin.node_rank())
            if self.start_method == "spawn":
                raise RuntimeError("start_method='spawn': the Trainer spawns the processes (tasktrain/strategies/"
                                   "spawn.py); setup_environment runs in each child.")
            from tasktrain.strategies.launcher import SubprocessLauncher

            launcher = SubprocessLauncher(self.devices, self.num_nodes)
            launcher.launch()
            _PROCESS["launcher"] = launcher
        self.env = env = self._environment()
        refuse_unstarted_slurm_tasks(env)  # (the batch script without srun: its tasks would never meet)
        self._root_device = None
        expected = self.devices * self.num_nodes
        if env.world_size != expected and plugin is not None:
            # (a ClusterEnvironment gives no local world size: its node_rank() and local_rank() place each process)
            raise RuntimeError(
                f"The cluster environment {type(plugin).__name__} (plugins=[...]) formed a world of {env.world_size} "
                f"processes, but the Trainer asked for devices={self.devices} x num_nodes={self.num_nodes} = "
                f"{expected}. Make them agree: pass devices= and num_nodes= whose product is {env.world_size} (the "
                "processes on each node, and the nodes), or start as many processes as asked."
            )
        if env.world_size != expected:
            nodes = max(1, env.world_size // max(1, env.local_world_size))
            raise RuntimeError(
                f"The launcher ({env.launcher}) formed a world of {env.world_size} processes "
                f"({env.local_world_size} on this machine), but the Trainer asked for devices={self.devices} x "
                f"num_nodes={self.num_nodes} = {expected}. Make them agree: pass devices={env.local_world_size}, "
                f"num_nodes={nodes} to the Trainer (or devices='auto'), or start as many processes as asked "
                "(torchrun --nproc_per_node / --nnodes, srun --ntasks)."
            )
        super().setup_environment()
        _install_error_reporting()
        if env.launcher == "self" and env.global_rank != 0:
            _watch_parent()
        if dist.is_initialized():
            if dist.get_world_size() != env.world_size:
                raise RuntimeError(
                    f"A process group of size {dist.get_world_size()} already exists, but this run's world is "
                    f"{env.world_size} process(es) (launcher: {env.launcher}). Make them agree: pass devices= and "
                    f"num_nodes= with devices x num_nodes = {dist.get_world_size()} (processes started with LOCAL_RANK "
                    "but not by torchrun form devices x num_nodes processes, as Lightning's), or start them with "
                    "torchrun.")
            self._start_watchdog()  # watchdog (issue 19)
            return
        backend = self.process_group_backend or ("nccl" if self.root_device.type == "cuda" else "gloo")
        if env.launcher is None:
            # A world of one with nobody to meet: a private free port, nothing left in os.environ.
            from tasktrain.strategies.launcher import find_free_port

            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0,
                                    world_size=1, timeout=self.timeout)
        else:
            # torchrun and self-launch set MASTER_ADDR/PORT already; SLURM's come from its variables; a user's
            # ClusterEnvironment plugin's win (Lightning's _init_dist_connection sets them from it).
            os.environ.setdefault("MASTER_ADDR", env.main_address)
            if env.main_port:
                os.environ.setdefault("MASTER_PORT", str(env.main_port))
            if plugin is not None:
                os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = env.main_address, str(env.main_port)
            # nccl: bind the group to this rank's GPU (barriers and object collectives then know their device)
            device_id = {"device_id": self.root_device} if backend == "nccl" else {}
            dist.init_process_group(backend, rank=env.global_rank, world_size=env.world_size, timeout=self.timeout,
                                    **device_id)
        _PROCESS["owns_group"] = True
        if not _PROCESS["exit_hook"]:
            atexit.register(_destroy_group_at_exit)
            _PROCESS["exit_hook"] = True
        self._start_watchdog()  # watchdog (issue 19)

    def _start_watchdog(self):
        """watchdog (issue 19): one per process group, started by the first strategy that wants one. Under
        self-launch rank 0 stops watching its workers once a verdict is out (they exit on purpose) and stops
        them last."""
        launcher = _PROCESS["launcher"]
        self.watchdog = start_watchdog(self.global_rank, self.world_size, self.stall_timeout,
                                       on_stop=launcher.stop_watching if launcher else None,
                                       on_exit=launcher.end_workers if launcher else None, report=record_error)

    def forward_signal(self, signum):
        launcher = _PROCESS["launcher"]
        if launcher is not None:  # self-launched workers get the news too
            launcher.forward_signal(signum)

    def mark_failed(self):
        mark_failed()

    def owns_world_of_one(self) -> bool:
        """This process made the group of a world nobody launched (one process): teardown ends it at once."""
        return self.env is not None and self.env.launcher is None and _PROCESS["owns_group"] and dist.is_initialized()

    def disown_group(self):
        """An engine destroyed the group itself (DeepSpeed's destroy, which also forgets its own copies of it)."""
        _PROCESS["owns_group"] = False

    def teardown(self):
        # The strategy's own teardown has dropped its wrappers and engines before calling this: what ties them to the
        # group goes before the group does. A world of one has nobody to wait for and nobody to share it with: it
        # goes now; a larger world's at exit (later stages of the same script reuse it).
        super().teardown()
        if self.owns_world_of_one():
            _destroy_group_at_exit()
        if self.environment_plugin is not None:  # Lightning's strategy teardown ends with its environment's
            self.environment_plugin.teardown()

    # -- collectives -----------------------------------------------------------------------------------------
    def _alone(self):
        """A world of one whose group ended with its run (teardown): its collectives are local, so that what
        Lightning allows after a run (trainer.save_checkpoint after fit) still works, as Lightning's group of one,
        which outlives the run, allows it."""
        return self.world_size == 1 and not dist.is_initialized()

    @checked_collective("reduce", data=("tensor",), arguments=lambda given: [  # watchdog (issue 19)
        ("tensor", given["tensor"]), ("op", lightning_reduce_op(given["group"], given["reduce_op"], given["op"]))])
    def reduce(self, tensor, group=None, reduce_op="mean", *, op=None):
        op = lightning_reduce_op(group, reduce_op, op)  # (Lightning's signature, and op=)
        if op not in _REDUCE_OPS:
            raise ValueError(f"reduce(op={op!r}): use one of {sorted(_REDUCE_OPS)}.")
        if not isinstance(tensor, torch.Tensor):
            tensor = torch.tensor(tensor, device=self.root_device)
        out = tensor.detach().clone().to(self.root_device)
        if self._alone():
            return out
        dist.all_reduce(out, op=_REDUCE_OPS[op])
        if op == "mean":
            out = out / self.world_size
        return out

    @checked_collective("all_gather", data=("tensor",))  # watchdog (issue 19)
    def all_gather(self, tensor, group=None, sync_grads=False):
        """Every rank's tensor, stacked: shape (world_size, *tensor.shape). All ranks must pass the same shape.
        sync_grads=True (Lightning's): torch.distributed.nn.functional.all_gather, whose backward sends each rank
        the gradient of its own tensor (summed over the ranks' losses)."""
        check_gather_group(group)
        if sync_grads:
            tensor = tensor.contiguous().to(self.root_device)
            if self._alone():
                return tensor.unsqueeze(0)
            import torch.distributed.nn.functional as dist_nn

            return torch.stack(dist_nn.all_gather(tensor))
        tensor = tensor.detach().contiguous().to(self.root_device)
        if self._alone():
            return tensor.unsqueeze(0).clone()
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(out, tensor)
        return torch.stack(out)

    @checked_collective("all_gather_object", objects=("obj",))  # watchdog (issue 19)
    def all_gather_object(self, obj):
        if self._alone():
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    @checked_collective("broadcast", objects=("obj",))  # watchdog (issue 19)
    def broadcast(self, obj, src=0):
        if self._alone():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    @checked_collective("barrier")  # watchdog (issue 19)
    def barrier(self, name=None):
        if dist.is_initialized():
            dist.barrier()

    @checked_collective("barrier", arguments=lambda given: [  # watchdog (issue 19): described as barrier(name=...)
        ("name", given["args"][0] if given["args"] else given["kwargs"].get("name"))])
    def lightning_barrier(self, *args, **kwargs):
        """barrier with the signature of Lightning's DDPStrategy / DeepSpeedStrategy.barrier(*args, **kwargs): a
        name, by position or name=, says where. (Its own checked collective, so that the watchdog names the caller's
        line, not a wrapper's.) A DDP-like strategy sets `barrier = ProcessWorld.lightning_barrier`."""
        if dist.is_initialized():
            dist.barrier()


def _destroy_group_at_exit():
    release_kept_runs()  # a run's kept engine goes before the group (its own exit hook ran first, normally)
    stop_watchdog()  # watchdog (issue 19): its thread talks to the store, which may go with the group
    gc.collect()  # nothing that holds gloo work may outlive the group (a full collection: ~0.1 s, once)
    if _PROCESS["owns_group"] and dist.is_initialized():
        # Every rank finishes its communication before any rank closes its side: a peer that tears its gloo
        # connections down while another process still runs gloo threads was seen to abort that process at
        # exit ("terminate called without an active exception"), rarely and under load. Bounded, and skipped
        # after an unhandled error (sys.last_value), when the peers may be gone.
        if dist.get_world_size() > 1 and not _PROCESS.get("failed") and not hasattr(sys, "last_value"):
            _exit_rendezvous(seconds=10.0)
        dist.destroy_process_group()
        _PROCESS["owns_group"] = False


def _exit_rendezvous(seconds):
    """Wait (bounded) until every rank reached its exit, through the rendezvous store, not a gloo collective:
    a rank still blocked in a collective, or gone, only costs the wait."""
    try:
        store = dist.distributed_c10d._get_default_store()
        store.add("tasktrain/exit", 1)
        deadline = time.monotonic() + seconds
        while store.add("tasktrain/exit", 0) < dist.get_world_size() and time.monotonic() < deadline:
            time.sleep(0.01)
    except Exception:  # the store's host (rank 0) may already be gone
        pass


def mark_failed():
    """This rank failed: at exit, do not wait for the others."""
    _PROCESS["failed"] = True


def _install_error_reporting():
    """Make an uncaught error of this rank reach whoever launched it: our launcher, or torchrun's summary."""
    if _PROCESS["error_hook"] or _error_file()[0] is None:
        return
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        if not issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            record_error(f"{exc_type.__name__}: {exc}", "".join(traceback.format_exception(exc_type, exc, tb)))
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook
    _PROCESS["error_hook"] = True


def _error_file():
    """Where whoever launched this rank reads why it failed: (path, in torchrun's format?) or (None, False)."""
    if os.environ.get("TASKTRAIN_LAUNCHER") == "self" and os.environ.get("TASKTRAIN_ERROR_FILE"):
        return os.environ["TASKTRAIN_ERROR_FILE"], False
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return os.environ["TORCHELASTIC_ERROR_FILE"], True
    return None, False


def record_error(summary, callstack=""):
    """Write this rank's failure where its launcher reads it: our launcher's line, torchrun's summary."""
    path, torchrun_format = _error_file()
    if path is None:
        return
    if torchrun_format:  # the layout torchrun's ChildFailedError summary reads
        summary = json.dumps({"message": {"message": summary, "extraInfo": {
            "py_callstack": callstack or summary, "timestamp": str(int(time.time()))}}})
    try:
        with open(path, "w") as f:
            f.write(summary)
    except OSError:
        pass


def _watch_parent():
    """A self-launched worker ends when rank 0 (its parent) is gone, instead of waiting on it until the timeout."""
    parent = int(os.environ.get("TASKTRAIN_PARENT_PID", "0"))
    if not parent or _PROCESS.get("parent_watch"):
        return
    _PROCESS["parent_watch"] = True

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        print(f"[tasktrain] rank {os.environ.get('RANK')}: rank 0 (pid {parent}) is gone; exiting.", file=sys.stderr,
              flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="tasktrain-parent-watch", daemon=True).start()
