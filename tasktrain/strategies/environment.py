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


@dataclass
class ClusterEnvironment:
    global_rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    main_address: str = "127.0.0.1"
    main_port: Optional[int] = None
    launcher: Optional[str] = None  # "torchrun", "slurm", "self", "spawn" (ddp_spawn) or None: nobody launched us


def detect_environment(env=None) -> ClusterEnvironment:
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env and "LOCAL_RANK" in env:
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
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        world = int(env["SLURM_NTASKS"])
        nodes = int(env.get("SLURM_NNODES", 1))
        host = env.get("MASTER_ADDR") or _first_slurm_host(env.get("SLURM_NODELIST", "127.0.0.1"))
        port = env.get("MASTER_PORT") or str(10000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)
        return ClusterEnvironment(
            global_rank=int(env["SLURM_PROCID"]),
            world_size=world,
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            local_world_size=int(str(env.get("SLURM_NTASKS_PER_NODE", max(1, world // max(1, nodes)))).split("(")[0]),
            node_rank=int(env.get("SLURM_NODEID", 0)),
            main_address=host,
            main_port=int(port),
            launcher="slurm",
        )
    return ClusterEnvironment()


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
