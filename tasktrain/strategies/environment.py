"""Who am I: rank, world size, local rank, node rank and master address, read from the launcher's variables.

Three launchers are understood, in this order: torchrun / `tasktrain launch` (which runs torchrun), SLURM, and
our own self-launch (the Trainer re-running the user's command, which sets the same variables as torchrun, with
TASKTRAIN_LAUNCHER=self; the children of strategy="ddp_spawn" get TASKTRAIN_LAUNCHER=spawn).

`tasktrain launch` also passes the user's launch choices to the workers through the TASKTRAIN_* variables
below; `launch_config()` reads them back for `Trainer(strategy="auto", precision=None)` and `Accelerator()`.

    TASKTRAIN_LAUNCH                  "1" when the process was started by `tasktrain launch`
    TASKTRAIN_STRATEGY                a registry name: "single_device", "ddp", "deepspeed_stage_2", ...;
                                      `tasktrain launch` sets "deepspeed" for every DeepSpeed choice and puts the
                                      stage and offload flags in TASKTRAIN_DEEPSPEED
    TASKTRAIN_PRECISION               "32-true" | "16-mixed" | "bf16-mixed" | "64-true" | "bf16-true" | "16-true"
    TASKTRAIN_USE_CPU                 "1" to train on CPU even where GPUs exist ("0": use GPUs where there are some)
    TASKTRAIN_NUM_PROCESSES           the total number of worker processes asked for (all machines)
    TASKTRAIN_NUM_MACHINES            the number of machines asked for
    TASKTRAIN_GRADIENT_ACCUMULATION_STEPS   micro-batches per optimizer step
    TASKTRAIN_GRADIENT_CLIPPING       max gradient norm (DeepSpeed's `gradient_clipping`; "0" = off); unset: not chosen
    TASKTRAIN_DEEPSPEED               JSON of DeepSpeed(...) keyword arguments, e.g.
                                      {"stage": 3, "offload_optimizer": false, "offload_parameters": false,
                                       "zero3_init": false, "save_16bit_model": false, "config": null}
    TASKTRAIN_FSDP                    JSON of FSDP(...) keyword arguments from fsdp_config (beyond what the strategy's
                                      name says), class names as strings, e.g. {"reshard_after_forward": false,
                                      "wrap": ["Block"], "activation_checkpointing": ["Block"]}
"""
import json
import os
from dataclasses import dataclass, field
from typing import Optional

from tasktrain.exceptions import MisconfigurationException


@dataclass
class ClusterEnvironment:
    global_rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    main_address: str = "127.0.0.1"
    main_port: Optional[int] = None
    # "torchrun", "slurm", "self", "spawn" (ddp_spawn), "external" (a user's ClusterEnvironment plugin that says its
    # cluster started the processes, environment_from_plugin; or LOCAL_RANK alone, environment_from_local_rank) or
    # None: nobody launched us
    launcher: Optional[str] = None
    # SLURM's batch script run without srun (SLURM_PROCID set, no SLURM_STEP_ID, SLURM_NTASKS > 1): the allocation's
    # world, whose other tasks nobody started. Read as Lightning reads it (a SLURM world of SLURM_NTASKS); a run refuses
    # to start in it (refuse_unstarted_slurm_tasks), where Lightning would wait for them at the process group.
    slurm_tasks_not_started: int = 0


def detect_environment(env=None, lightning=False) -> ClusterEnvironment:
    """The launcher's variables. RANK, WORLD_SIZE and LOCAL_RANK are a launch's (torchrun's, `tasktrain launch`'s, our
    own self-launch's or ddp_spawn's), as Accelerate reads them. lightning=True reads them as Lightning's Trainer:
    torchrun's only where torchrun set TORCHELASTIC_RUN_ID (its TorchElasticEnvironment.detect), or tasktrain's own
    launch set TASKTRAIN_LAUNCHER; otherwise RANK is not read, and LOCAL_RANK is a launcher of one's own's
    (environment_from_local_rank: rank node_rank * devices + local_rank, as Lightning's LightningEnvironment)."""
    env = os.environ if env is None else env
    launched = not lightning or "TORCHELASTIC_RUN_ID" in env or "TASKTRAIN_LAUNCHER" in env
    if "RANK" in env and "WORLD_SIZE" in env and "LOCAL_RANK" in env and launched:
        world = int(env["WORLD_SIZE"])
        return ClusterEnvironment(
            global_rank=int(env["RANK"]),
            world_size=world,
            local_rank=int(env["LOCAL_RANK"]),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
            # torchrun sets GROUP_RANK for the node rank; NODE_RANK is what self-launch and some clusters set.
            node_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", 0))),
            main_address=env.get("MASTER_ADDR", "127.0.0.1"),
            main_port=int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None,
            launcher=env.get("TASKTRAIN_LAUNCHER", "torchrun"),
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return _slurm_environment(env)
    return ClusterEnvironment()


def environment_from_local_rank(devices: int, num_nodes: int, env=None, meeting=True,
                                lightning=False) -> Optional[ClusterEnvironment]:
    """Lightning's LightningEnvironment where a launcher of one's own started the process with LOCAL_RANK (and
    NODE_RANK / GROUP_RANK, MASTER_ADDR, MASTER_PORT) but not torchrun's RANK / WORLD_SIZE: Lightning takes it as one
    rank of a world it did not start (creates_processes_externally), global rank node_rank * devices + local_rank of
    devices * num_nodes, and starts nothing. None where that is not the case (torchrun's or SLURM's variables, no
    LOCAL_RANK) or the world is one process. A world of several without MASTER_PORT is an error (Lightning picks a
    free port in each process, so the ranks would wait for each other until the timeout), and so is a LOCAL_RANK not
    below `devices` (LocalRankBeyondDevices; under the Trainer a world of one too: Lightning reads rank 1 of 1 there);
    `meeting=False` reads the ranks only (right after Trainer(...), as Lightning's: both are checked at the set-up). `lightning`: detect_environment's (RANK /
    WORLD_SIZE beside LOCAL_RANK without torchrun are then this case too)."""
    env = os.environ if env is None else env
    if "LOCAL_RANK" not in env:
        return None
    local = int(env["LOCAL_RANK"])
    # a local rank past the devices has no device (Lightning's ranks read it all the same, rank 1 of 1 for
    # strategy="ddp", devices=1 under LOCAL_RANK=1, and its set-up fails on parallel_devices[local_rank])
    beyond = local >= devices and (lightning or devices * num_nodes > 1)
    if (devices * num_nodes <= 1 and not beyond) or detect_environment(env, lightning=lightning).launcher is not None:
        return None
    node = int(env.get("NODE_RANK", env.get("GROUP_RANK", 0)))
    if meeting and beyond:
        raise LocalRankBeyondDevices(
            f"LOCAL_RANK={local} is set without torchrun's RANK / WORLD_SIZE, so this process is taken as local rank "
            f"{local} of a machine that a launcher of your own started (as Lightning takes it), but the Trainer runs "
            f"devices={devices} process(es) per machine: LOCAL_RANK must be smaller than devices (0 to {devices - 1}). "
            "Unset LOCAL_RANK to let the Trainer start the processes itself, or pass devices= the number of processes "
            "your launcher starts on each machine, or launch with torchrun / `tasktrain launch`.")
    if meeting and not env.get("MASTER_PORT"):
        raise RuntimeError(
            f"LOCAL_RANK={local} is set without RANK / WORLD_SIZE: this process is taken as rank "
            f"{node * devices + local} of a world of devices={devices} x num_nodes={num_nodes} that a launcher of your "
            "own started (as Lightning takes it), but MASTER_PORT is not set, so the ranks cannot meet. Set "
            "MASTER_ADDR and MASTER_PORT in every process, or launch with torchrun / `tasktrain launch`, or unset "
            "LOCAL_RANK to let the Trainer start the processes itself.")
    return ClusterEnvironment(global_rank=node * devices + local, world_size=devices * num_nodes, local_rank=local,
                              local_world_size=devices, node_rank=node,
                              main_address=env.get("MASTER_ADDR", "127.0.0.1"),
                              main_port=int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None,
                              launcher="external")


class LocalRankBeyondDevices(MisconfigurationException, IndexError):
    """LOCAL_RANK (a launcher of one's own's) is not below `devices`: refused at the run's set-up, before any process
    group, where Lightning's set-up fails with an IndexError (its parallel_devices[local_rank]): both that type and
    tasktrain's MisconfigurationException."""


def environment_from_plugin(plugin, devices: int, num_nodes: int) -> ClusterEnvironment:
    """A user's own cluster environment (Lightning's ClusterEnvironment interface: local_rank(), node_rank(),
    set_global_rank(), set_world_size(), global_rank(), world_size(), main_address, main_port,
    creates_processes_externally) read as Lightning's DDP strategy reads it when it sets up the process group
    (set_world_ranks, then _init_dist_connection): the ranks are set from (node, local rank) first, then read back.
    Called once a process knows it is a rank (after this process started its workers, where it starts them)."""
    local, node = int(plugin.local_rank()), int(plugin.node_rank())
    plugin.set_global_rank(node * devices + local)
    plugin.set_world_size(num_nodes * devices)
    launcher = "external" if plugin.creates_processes_externally else detect_environment().launcher
    return ClusterEnvironment(global_rank=int(plugin.global_rank()), world_size=int(plugin.world_size()),
                              local_rank=local, local_world_size=devices, node_rank=node,
                              main_address=str(plugin.main_address), main_port=int(plugin.main_port),
                              launcher=launcher)


# -- mpirun / mpiexec under the Accelerator -----------------------------------------------------------------------------
# MPI's launchers' variables, read as Accelerate 1.15 reads them (accelerate/state.py, PartialState(cpu=True), and
# get_cpu_distributed_information): MPICH's and Intel MPI's Hydra (PMI_*, MPI_LOCAL*), Open MPI's, MVAPICH's; the
# first name set (to a number >= 0) wins, torchrun's own name first.
MPI_RANK = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
MPI_WORLD_SIZE = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
MPI_LOCAL_RANK = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK")
MPI_LOCAL_WORLD_SIZE = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                        "MV2_COMM_WORLD_LOCAL_SIZE")
MPI_DEFAULT_PORT = "29500"  # Accelerate's, where MASTER_PORT is not set


def _first_number(env, names, default):
    for name in names:
        value = int(env.get(name, -1))
        if value >= 0:
            return value
    return default


def mpi_world_size(env=None) -> int:
    """The number of processes mpirun / mpiexec started (1 where none did)."""
    env = os.environ if env is None else env
    return _first_number(env, MPI_WORLD_SIZE[1:], 1)


def join_mpi_world(cpu: bool, env=None) -> None:
    """Under mpirun / mpiexec (MPI's variables, no torchrun's, SLURM's or a LOCAL_RANK of one's own), make this process
    a rank of MPI's world for the Accelerator, as Accelerate's PartialState(cpu=True) does: RANK, WORLD_SIZE,
    LOCAL_RANK and LOCAL_WORLD_SIZE are set from MPI's (the variables torchrun sets: every later read of the world is
    the one of a launch), MASTER_PORT defaults to 29500; MASTER_ADDR must be set where the ranks are on several hosts
    (Accelerate's error), on one host it defaults to 127.0.0.1 (where Accelerate fails in torch's rendezvous). As in
    Accelerate, where OMP_NUM_THREADS is not set each rank uses its share of the host's physical cores.

    Not on CPU (cpu=False): an error. Accelerate reads MPI's variables only with cpu=True; without it each process
    trains alone on its whole data (distributed_type NO in each), which is never what mpiexec -n N was for."""
    env = os.environ if env is None else env
    world = mpi_world_size(env)
    if world <= 1 or any(name in env for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")) or \
            "SLURM_PROCID" in env:
        return
    said = next(f"{name}={env[name]}" for name in MPI_WORLD_SIZE[1:] if int(env.get(name, -1)) >= 0)
    if not cpu:
        raise ValueError(
            f"mpirun / mpiexec started {world} processes ({said}), but the Accelerator reads MPI's ranks only on CPU, "
            "as Accelerate's does (its PartialState(cpu=True)): without that each process would train alone on all "
            "the data. Pass Accelerator(cpu=True) (or PartialState(cpu=True)), or set ACCELERATE_USE_CPU=1 for the "
            "Accelerator; on GPUs start the processes with torchrun or `tasktrain launch` instead.")
    rank = _first_number(env, MPI_RANK, 0)
    local_rank = _first_number(env, MPI_LOCAL_RANK, 0)
    local_world = _first_number(env, MPI_LOCAL_WORLD_SIZE, 1)
    if not env.get("MASTER_ADDR"):
        if local_world != world:
            raise ValueError(
                f"mpirun / mpiexec started {world} processes on several hosts ({local_world} on this one), but "
                "MASTER_ADDR is not set, so the ranks cannot meet. Export rank 0's host name or address as MASTER_ADDR "
                f"to every process (`mpiexec -genv MASTER_ADDR <host> -n {world} ...`, Open MPI: `-x MASTER_ADDR`), "
                "as Accelerate asks.")
        env["MASTER_ADDR"] = "127.0.0.1"  # (every rank is on this host)
    env.setdefault("MASTER_PORT", MPI_DEFAULT_PORT)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(local_world))
    if _first_number(env, ("OMP_NUM_THREADS",), 0) == 0:
        import warnings

        import torch

        try:
            import psutil  # (Accelerate's count: physical cores)

            cores = psutil.cpu_count(logical=False)
        except ImportError:  # (not a tasktrain dependency)
            cores = None
        threads = max(1, int((cores or os.cpu_count() or 1) / local_world))
        torch.set_num_threads(threads)
        warnings.warn(f"OMP_NUM_THREADS is not set: each of the {local_world} processes on this host uses {threads} "
                      "thread(s) (its share of the physical cores, as Accelerate sets); set OMP_NUM_THREADS to "
                      "choose.")


# -- SLURM ------------------------------------------------------------------------------------------------------------
# Which SLURM processes form a world (Lightning's rules where they are sound, see docs/slurm.md):
# - a job step that `srun` launched with several tasks (SLURM_STEP_NUM_TASKS > 1): one world of those tasks, whatever
#   the job's name. Lightning ignores every job named "bash" or "interactive", so `srun python train.py` inside
#   `salloc` (job name "interactive") became separate one-process runs writing to one folder; here it is one world.
# - a step of one task in a job named "bash" or "interactive" (`srun --pty bash`, `salloc`'s shell): an interactive
#   shell on a node, not a launch: the Trainer may start its own processes there, as in Lightning.
# - a step of one task otherwise: a world of one, SLURM-managed.
# - the batch script itself (SLURM_PROCID set, no SLURM_STEP_ID) in an allocation of several tasks: the user ran
#   `python train.py` without srun; the other tasks never start, so rank 0 would wait for them for the whole
#   process-group timeout. Read as Lightning reads it (a SLURM world of SLURM_NTASKS, so that Trainer(...) and its
#   properties answer as Lightning's), and refused, naming srun, where a run starts (refuse_unstarted_slurm_tasks).
#   A job named "bash" or "interactive" opts out of SLURM there too, as in Lightning (the Trainer starts its own).
INTERACTIVE_JOB_NAMES = ("bash", "interactive")


class SlurmAllocationError(RuntimeError):
    """The SLURM allocation and the run disagree (the message names the SLURM variables and the fix)."""


def _slurm_environment(env) -> ClusterEnvironment:
    in_step = "SLURM_STEP_ID" in env or "SLURM_STEPID" in env
    tasks = int(env["SLURM_NTASKS"])
    if env.get("SLURM_JOB_NAME") in INTERACTIVE_JOB_NAMES and (tasks == 1 or not in_step):
        return ClusterEnvironment()  # an interactive shell on a node, or a job named so to opt out: not a launch
    per_node = _tasks_per_node(env)
    nodes = int(env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES", 1)))
    if len(set(per_node)) > 1:
        name = "SLURM_STEP_TASKS_PER_NODE" if "SLURM_STEP_TASKS_PER_NODE" in env else "SLURM_TASKS_PER_NODE"
        raise SlurmAllocationError(
            f"SLURM spread the {tasks} tasks unevenly over {nodes} nodes ({name}={env[name]}): every node must run "
            f"the same number of processes. Ask for --nodes=N --ntasks-per-node=K (K = processes per node, e.g. one "
            f"per GPU) instead of --ntasks={tasks}."
        )
    local_world = per_node[0] if per_node else max(1, tasks // max(1, nodes))
    host = env.get("MASTER_ADDR") or _first_slurm_host(env.get("SLURM_STEP_NODELIST") or
                                                       env.get("SLURM_NODELIST", "127.0.0.1"))
    port = env.get("MASTER_PORT") or str(10000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)
    return ClusterEnvironment(
        global_rank=int(env["SLURM_PROCID"]),
        world_size=tasks,
        local_rank=int(env.get("SLURM_LOCALID", 0)),
        local_world_size=local_world,
        node_rank=int(env.get("SLURM_NODEID", 0)),
        main_address=host,
        main_port=int(port),
        launcher="slurm",
        slurm_tasks_not_started=0 if in_step else tasks - 1,
    )


def refuse_unstarted_slurm_tasks(env: ClusterEnvironment):
    """The batch script run without srun in an allocation of several tasks (detect_environment's
    slurm_tasks_not_started): the other tasks never start, so rank 0 would wait for them for the whole process-group
    timeout (Lightning's does). Called where a run starts, before any process group forms: the Trainer's
    fit / validate / test / predict (its construction reads the world as Lightning's does), the Accelerator's
    construction (which joins the group), a multi-process strategy's set-up."""
    missing = env.slurm_tasks_not_started
    if missing:
        raise SlurmAllocationError(
            f"This process is SLURM's batch script (SLURM_PROCID is set but SLURM_STEP_ID is not), and the allocation "
            f"has SLURM_NTASKS={missing + 1} tasks: the other {missing} task(s) were never started, so this run would "
            f"wait for them until the process-group timeout. Launch every task with srun: `srun python "
            f"{_script_hint()}` in the sbatch script (or `srun tasktrain launch ...` with --ntasks-per-node=1), or "
            f"ask for one task (#SBATCH --ntasks=1) and let the Trainer start its processes itself."
        )


def launcher_rank(default=0):
    """The global rank a launcher's variables give this process, read as Lightning's rank_zero_only reads them (RANK,
    then LOCAL_RANK, then SLURM_PROCID, then LSF's JSM_NAMESPACE_RANK); `default` where none is set (nobody launched
    it)."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return default


def warn_if_srun_unused(rank=None, stacklevel=4):
    """Lightning's hint where `srun` is installed but did not start this process (its
    SLURMEnvironment._validate_srun_used, its words): a script run with plain `python` on a SLURM cluster's login or
    batch node is a frequent mistake. Lightning says it wherever it asks whether SLURM launched the run: at a Trainer's
    construction when no cluster environment is given and torchrun did not start the process, at a
    SLURMEnvironment's construction and detect(), and at each run's start without a checkpoint path (its
    checkpoint connector asks for SLURM's requeue checkpoint); rank 0 only (`rank`: the launcher's variables where
    not given). Not on Windows (Lightning's neither). `stacklevel`: warnings.warn's, the user's call where the caller
    says how deep it is."""
    import shutil
    import sys
    import warnings

    from tasktrain.exceptions import PossibleUserWarning

    if os.name == "nt" or shutil.which("srun") is None:
        return
    if "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in INTERACTIVE_JOB_NAMES:
        return  # srun started it (an interactive job's shell does not count, as Lightning's _is_srun_used)
    if (launcher_rank() if rank is None else rank) != 0:
        return
    hint = " ".join(["srun", os.path.basename(sys.executable), *sys.argv])[:64]
    warnings.warn("The `srun` command is available on your system but is not used. HINT: If your intention is to run"
                  f" Lightning on SLURM, prepend your python command with `srun` like so: {hint} ...",
                  PossibleUserWarning, stacklevel=stacklevel)


def _tasks_per_node(env):
    """SLURM's compressed tasks-per-node list ("2(x3),1" -> [2, 2, 2, 1]); [] when SLURM gave none."""
    text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or \
        env.get("SLURM_NTASKS_PER_NODE") or ""
    counts = []
    for part in filter(None, text.split(",")):
        if "(x" in part:
            count, repeat = part.rstrip(")").split("(x")
            counts += [int(count)] * int(repeat)
        else:
            counts.append(int(part))
    return counts


def _script_hint():
    import sys

    return " ".join(sys.argv)[:80] or "train.py"


def check_slurm_allocation(env: ClusterEnvironment, devices: int, num_nodes: int, names=None, source=None):
    """Lightning's rules: under a SLURM launch, the processes per node (devices) and the number of nodes asked for
    must be what the job step has (SLURM_NTASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE, SLURM_NNODES /
    SLURM_STEP_NUM_NODES). Checked before any process group forms, the same on every rank."""
    if env.launcher != "slurm":
        return
    variables = os.environ
    nodes = env.world_size // max(1, env.local_world_size)
    given = source or "the Trainer"
    names = names or {"devices": "devices", "num_nodes": "num_nodes"}
    if devices != env.local_world_size:
        raise SlurmAllocationError(
            f"{given} asks for {names['devices']}={devices} processes per node, but the SLURM job step runs "
            f"{env.local_world_size} task(s) per node (SLURM_STEP_TASKS_PER_NODE="
            f"{variables.get('SLURM_STEP_TASKS_PER_NODE', variables.get('SLURM_TASKS_PER_NODE', '?'))}, "
            f"SLURM_NTASKS_PER_NODE={variables.get('SLURM_NTASKS_PER_NODE', 'unset')}). Make them agree: pass "
            f"{names['devices']}={env.local_world_size} (or 'auto'), or ask SLURM for "
            f"#SBATCH --ntasks-per-node={devices} (one task per device)."
        )
    if num_nodes != nodes:
        raise SlurmAllocationError(
            f"{given} asks for {names['num_nodes']}={num_nodes} nodes, but the SLURM job step runs on {nodes} "
            f"(SLURM_NNODES={variables.get('SLURM_NNODES', '?')}, SLURM_STEP_NUM_NODES="
            f"{variables.get('SLURM_STEP_NUM_NODES', 'unset')}). Make them agree: pass {names['num_nodes']}={nodes}, "
            f"or ask SLURM for #SBATCH --nodes={num_nodes}."
        )


def check_launch_in_slurm(num_machines: int, num_processes: int, env=None):
    """`tasktrain launch` run by srun: one launcher per node, and the launch config's machines and processes are the
    job step's nodes and (nodes x processes per node). Nothing to check outside a SLURM job step."""
    env = os.environ if env is None else env
    if "SLURM_STEP_ID" not in env and "SLURM_STEPID" not in env:
        return
    nodes = int(env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES", 1)))
    tasks = int(env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", 1)))
    if tasks != nodes:
        raise SlurmAllocationError(
            f"tasktrain launch runs once per node and starts the processes of its node itself, but srun started "
            f"{tasks} launchers on {nodes} node(s) (SLURM_STEP_NUM_TASKS={tasks}, SLURM_STEP_NUM_NODES={nodes}). Run "
            f"it with `srun --ntasks-per-node=1 tasktrain launch ...` (#SBATCH --ntasks-per-node=1)."
        )
    if num_machines != nodes:
        raise SlurmAllocationError(
            f"The launch config says num_machines={num_machines}, but the SLURM job step has {nodes} node(s) "
            f"(SLURM_STEP_NUM_NODES={nodes}). Pass --num_machines {nodes} (--num_processes = {nodes} x processes "
            f"per node), or ask SLURM for #SBATCH --nodes={num_machines}."
        )
    if num_processes % max(1, num_machines):
        raise SlurmAllocationError(
            f"The launch config says num_processes={num_processes} on num_machines={num_machines}: each node must "
            f"run the same number of processes; pass a multiple of {num_machines}."
        )


def _first_slurm_host(nodelist: str) -> str:
    # "node[001-004,007],other" -> "node001"
    first = nodelist.split(",")[0]
    if "[" in first:
        prefix, rest = first.split("[", 1)
        return prefix + rest.rstrip("]").split(",")[0].split("-")[0]
    return first


@dataclass
class LaunchConfig:
    """The choices `tasktrain launch` passed to this worker (all None when it was not launched that way)."""
    launched: bool = False
    strategy: Optional[str] = None
    precision: Optional[str] = None
    use_cpu: Optional[bool] = None
    num_processes: Optional[int] = None
    num_machines: Optional[int] = None
    gradient_accumulation_steps: Optional[int] = None
    gradient_clipping: Optional[float] = None
    deepspeed: dict = field(default_factory=dict)
    fsdp: dict = field(default_factory=dict)


def launch_config(env=None) -> LaunchConfig:
    env = os.environ if env is None else env

    def integer(name):
        return int(env[name]) if env.get(name) else None

    return LaunchConfig(
        launched=env.get("TASKTRAIN_LAUNCH") == "1",
        strategy=env.get("TASKTRAIN_STRATEGY") or None,
        precision=env.get("TASKTRAIN_PRECISION") or None,
        use_cpu=(env["TASKTRAIN_USE_CPU"] == "1") if env.get("TASKTRAIN_USE_CPU") else None,
        num_processes=integer("TASKTRAIN_NUM_PROCESSES"),
        num_machines=integer("TASKTRAIN_NUM_MACHINES"),
        gradient_accumulation_steps=integer("TASKTRAIN_GRADIENT_ACCUMULATION_STEPS"),
        gradient_clipping=float(env["TASKTRAIN_GRADIENT_CLIPPING"]) if env.get("TASKTRAIN_GRADIENT_CLIPPING") else None,
        deepspeed=json.loads(env["TASKTRAIN_DEEPSPEED"]) if env.get("TASKTRAIN_DEEPSPEED") else {},
        fsdp=json.loads(env["TASKTRAIN_FSDP"]) if env.get("TASKTRAIN_FSDP") else {},
    )
