"""Strategy names and the "auto" choice.

Explicit arguments win; then what `tasktrain launch` passed (TASKTRAIN_* variables); then torchrun / SLURM
variables; then the hardware. The names themselves are in the table of tasktrain/names.py.
"""
import os

import torch

from tasktrain.names import AUTO_STRATEGY, STRATEGIES
from tasktrain.strategies.environment import detect_environment


def strategy_from_name(name: str, **extra):
    import importlib

    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}. Valid names: {', '.join([AUTO_STRATEGY, *STRATEGIES])}, "
                         "or pass a Strategy instance (e.g. DDP(...), DeepSpeed(stage=2)).")
    entry = STRATEGIES[name]
    cls = getattr(importlib.import_module(entry.module), entry.cls)
    return cls(**{**entry.kwargs, **extra})


def strategy_of_launch(launch):
    """The strategy a `tasktrain launch` config chose (environment.launch_config()): a registry name, or, for
    DeepSpeed (which the launcher names "deepspeed" with its arguments alongside) and FSDP with fsdp_config
    arguments, the configured instance."""
    if launch.strategy == "deepspeed" and launch.deepspeed:
        return strategy_from_name("deepspeed", **launch.deepspeed)
    if launch.strategy == "model_parallel" and os.environ.get("PARALLELISM_CONFIG_TP_SIZE"):  # issue 39
        return strategy_from_name("model_parallel", tensor_parallel_size=int(os.environ["PARALLELISM_CONFIG_TP_SIZE"]))
    if launch.fsdp and launch.strategy in STRATEGIES and STRATEGIES[launch.strategy].distributed_type == "FSDP":
        return strategy_from_name(launch.strategy, **launch.fsdp)  # wrap / activation_checkpointing by class name
    return launch.strategy


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
    if strategy == AUTO_STRATEGY:
        if devices * num_nodes > 1 or env.world_size > 1:
            strategy = "ddp"
        else:
            strategy = "single_device"
    return strategy_from_name(strategy)
