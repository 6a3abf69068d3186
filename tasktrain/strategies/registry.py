"""Strategy names and the "auto" choice.

Explicit arguments win; then what `tasktrain launch` passed (TASKTRAIN_* variables); then torchrun / SLURM
variables; then the hardware. Later work adds names here, nothing else changes.
"""
import torch

from tasktrain.strategies.environment import detect_environment

# name -> (module path, class name, keyword arguments)
STRATEGIES = {
    "single_device": ("tasktrain.strategies.single_device", "SingleDevice", {}),
    "ddp": ("tasktrain.strategies.ddp", "DDP", {}),
    "ddp_spawn": ("tasktrain.strategies.ddp", "DDP", {"start_method": "spawn"}),
    "ddp_find_unused_parameters_true": ("tasktrain.strategies.ddp", "DDP", {"find_unused_parameters": True}),
    "dp": ("tasktrain.strategies.data_parallel", "DataParallel", {}),
    "deepspeed": ("tasktrain.strategies.deepspeed", "DeepSpeed", {}),
    "deepspeed_stage_1": ("tasktrain.strategies.deepspeed", "DeepSpeed", {"stage": 1}),
    "deepspeed_stage_2": ("tasktrain.strategies.deepspeed", "DeepSpeed", {"stage": 2}),
    "deepspeed_stage_2_offload": ("tasktrain.strategies.deepspeed", "DeepSpeed", {"stage": 2, "offload_optimizer": True}),
    "deepspeed_stage_3": ("tasktrain.strategies.deepspeed", "DeepSpeed", {"stage": 3}),
    "deepspeed_stage_3_offload": ("tasktrain.strategies.deepspeed", "DeepSpeed",
                                  {"stage": 3, "offload_optimizer": True, "offload_parameters": True}),
}


def strategy_from_name(name: str, **extra):
    import importlib

    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}. Valid names: {', '.join(['auto', *STRATEGIES])}, "
                         "or pass a Strategy instance (e.g. DDP(...), DeepSpeed(stage=2)).")
    module_path, class_name, kwargs = STRATEGIES[name]
    cls = getattr(importlib.import_module(module_path), class_name)
    return cls(**{**kwargs, **extra})


def resolve_accelerator(accelerator) -> str:
    if accelerator in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if accelerator == "gpu":
        accelerator = "cuda"
    if accelerator not in ("cpu", "cuda"):
        raise ValueError(f"Unknown accelerator {accelerator!r}: use 'auto', 'cpu' or 'cuda'.")
    if accelerator == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("accelerator='cuda' was asked for but no CUDA device is visible; use accelerator='cpu'.")
    return accelerator


def resolve_devices(devices, accelerator: str, env=None) -> int:
    env = env or detect_environment()
    if devices in (None, "auto", -1, "-1"):
        if env.launcher is not None:
            return env.local_world_size
        return torch.cuda.device_count() if accelerator == "cuda" and devices in (-1, "-1") else 1
    if isinstance(devices, (list, tuple)):
        return len(devices)
    try:
        count = int(devices)
    except (TypeError, ValueError):
        raise ValueError(f"devices={devices!r}: use 'auto', a positive number, or a list of device indices.") from None
    if count < 1:
        raise ValueError(f"devices={devices!r}: use 'auto' or a positive number of devices (processes on CPU).")
    return count


def resolve_strategy(strategy, accelerator: str, devices: int, num_nodes: int, env=None):
    """Turn the Trainer's `strategy` argument into a Strategy instance."""
    from tasktrain.strategies.base import Strategy

    env = env or detect_environment()
    if isinstance(strategy, Strategy):
        return strategy
    if not isinstance(strategy, str):
        raise TypeError(f"strategy must be a name or a Strategy instance, got {type(strategy).__name__}.")
    if strategy == "auto":
        if devices * num_nodes > 1 or env.world_size > 1:
            strategy = "ddp"
        else:
            strategy = "single_device"
    return strategy_from_name(strategy)
