from tasktrain.strategies.base import (ClipsInsideStep, GradientClip, MultiProcess, OneProcess, Plan, Sharded,
                                      Strategy)
from tasktrain.strategies.ddp import DDP, DDPStrategy
from tasktrain.strategies.parallel import ParallelStrategy
from tasktrain.strategies.precision import Precision
from tasktrain.strategies.registry import StrategyRegistry
from tasktrain.strategies.single_device import SingleDevice, SingleDeviceStrategy
from tasktrain.strategies.world import ProcessWorld

__all__ = ["Strategy", "OneProcess", "ProcessWorld", "MultiProcess", "Sharded", "ClipsInsideStep", "Plan", "GradientClip", "DDP",
           "Precision", "SingleDevice", "SingleDeviceStrategy", "ParallelStrategy", "DDPStrategy", "StrategyRegistry"]


def __getattr__(name):
    # Lightning's `from lightning.pytorch.strategies import ModelParallelStrategy` under the rename rule (its tensor
    # parallel example), imported only when asked for: it brings FSDP2 and DTensor
    if name == "ModelParallelStrategy":
        from tasktrain.strategies.model_parallel import ModelParallelStrategy

        return ModelParallelStrategy
    if name in ("DeepSpeedStrategy", "FSDPStrategy"):  # Lightning's classes, with their arguments (lightning.py)
        from tasktrain.strategies import lightning

        return getattr(lightning, name)
    raise AttributeError(f"module 'tasktrain.strategies' has no attribute {name!r}")
