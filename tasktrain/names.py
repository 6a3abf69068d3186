"""The one table of names: strategies, precisions and their aliases.

The registry (tasktrain/strategies/registry.py), the precision plugins (tasktrain/strategies/precision.py), the
Trainer, the Accelerator and the launcher's config (tasktrain/cli/config.py) all read it, so a name accepted by
one is accepted by all. A leaf module without torch: `tasktrain launch` checks a config file in a fraction of a
second.
"""
from typing import NamedTuple


class StrategyName(NamedTuple):
    module: str  # where the class lives
    cls: str
    kwargs: dict  # the constructor's arguments this name stands for
    distributed_type: str  # Accelerate's name of it in a launch config: "NO" (one process), "MULTI_GPU" (DDP; on
    #                        CPU MULTI_CPU), "DEEPSPEED" or "FSDP"


def _ddp(**kwargs):
    return StrategyName("tasktrain.strategies.ddp", "DDP", kwargs, "MULTI_GPU")


def _deepspeed(**kwargs):
    return StrategyName("tasktrain.strategies.deepspeed", "DeepSpeed", kwargs, "DEEPSPEED")


STRATEGIES = {
    "single_device": StrategyName("tasktrain.strategies.single_device", "SingleDevice", {}, "NO"),
    "ddp": _ddp(),
    "ddp_spawn": _ddp(start_method="spawn"),
    "ddp_find_unused_parameters_true": _ddp(find_unused_parameters=True),
    "dp": StrategyName("tasktrain.strategies.data_parallel", "DataParallel", {}, "NO"),
    "deepspeed": _deepspeed(),
    "deepspeed_stage_1": _deepspeed(stage=1),
    "deepspeed_stage_2": _deepspeed(stage=2),
    "deepspeed_stage_2_offload": _deepspeed(stage=2, offload_optimizer=True),
    "deepspeed_stage_3": _deepspeed(stage=3),
    "deepspeed_stage_3_offload": _deepspeed(stage=3, offload_optimizer=True, offload_parameters=True),
    # Offload to disk: the folder comes with the name, Trainer(strategy="deepspeed_stage_3_offload_nvme") alone is
    # an error asking for it (strategy_from_name(name, nvme_path=...) or DeepSpeed(..., nvme_path=...)).
    "deepspeed_stage_3_offload_nvme": _deepspeed(stage=3, offload_optimizer=True, offload_parameters=True,
                                                 offload_device="nvme"),
    "fsdp": StrategyName("tasktrain.strategies.fsdp", "FSDP", {}, "FSDP"),
    "fsdp_cpu_offload": StrategyName("tasktrain.strategies.fsdp", "FSDP", {"cpu_offload": True}, "FSDP"),
    # tensor x data parallel on one DeviceMesh (issue 39); Accelerate names its FSDP2-based meshes FSDP too
    # (the name is data parallel only; the class defaults to Lightning's tensor_parallel_size="auto")
    "model_parallel": StrategyName("tasktrain.strategies.model_parallel", "ModelParallelStrategy",
                                   {"tensor_parallel_size": 1}, "FSDP"),
}
# Names one process runs from start to end, starting its other processes itself (ddp_spawn) or driving every device
# from one process (dp): a launcher that starts every rank (mpirun, tasktrain/cli/config.py) cannot run them.
ONE_PROCESS_STARTS = frozenset(name for name, entry in STRATEGIES.items()
                               if entry.kwargs.get("start_method") == "spawn" or entry.cls == "DataParallel")
AUTO_STRATEGY = "auto"  # ddp when several processes are asked for or were launched, else single_device

# precision name -> its aliases (Lightning's numbers and strings, Accelerate's "no" / "fp16" / "bf16"). The true
# half modes (parameters stored in half, no fp32 master copy) have no alias: Lightning spells them this way only,
# and Accelerate has no name for them.
PRECISIONS = {
    "32-true": ("32", 32, "fp32", "no"),
    "16-mixed": ("16", 16, "fp16"),
    "bf16-mixed": ("bf16",),
    "64-true": ("64", 64),
    "bf16-true": (),
    "16-true": (),
}
PRECISION_ALIASES = {alias: name for name, aliases in PRECISIONS.items() for alias in (name, *aliases)}
DEFAULT_PRECISION = "32-true"

# Accelerate's `mixed_precision` values (launch configs, Accelerator(mixed_precision=...)) and what they mean.
MIXED_PRECISION = {"no": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}


def normalize_precision(value) -> str:
    """A precision name or alias -> its name; None -> the default. An unknown value is a ValueError listing them."""
    if value is None:
        return DEFAULT_PRECISION
    if isinstance(value, bool) or value not in PRECISION_ALIASES:
        from tasktrain.exceptions import MisconfigurationException

        aliases = ", ".join(repr(a) for name in PRECISIONS for a in PRECISIONS[name])
        raise MisconfigurationException(  # (Lightning's words first; its ValueError too)
            f"Precision {value!r} is invalid. Allowed precision values: {', '.join(PRECISIONS)} (aliases: {aliases}). "
            "Use for example precision='bf16-mixed'."
        )
    return PRECISION_ALIASES[value]


def deepspeed_name(stage, offload_optimizer, offload_parameters, nvme_path=None) -> str:
    """The registry name of a DeepSpeed choice, where one exists; plain "deepspeed" (arguments elsewhere) if not.
    offload_...: False, True or "cpu" (memory), "nvme" (disk; its folder, nvme_path, is an argument no name holds)."""
    if "nvme" in (offload_optimizer, offload_parameters):
        return "deepspeed"
    wanted = {"stage": stage}
    if offload_optimizer:
        wanted["offload_optimizer"] = True
    if offload_parameters:
        wanted["offload_parameters"] = True
    for name, entry in STRATEGIES.items():
        if entry.distributed_type == "DEEPSPEED" and entry.kwargs == wanted:
            return name
    return "deepspeed"
