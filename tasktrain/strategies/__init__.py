from tasktrain.strategies.base import (ClipsInsideStep, GradientClip, MultiProcess, OneProcess, Plan, Sharded,
                                      Strategy)
from tasktrain.strategies.ddp import DDP
from tasktrain.strategies.precision import Precision
from tasktrain.strategies.single_device import SingleDevice, SingleDeviceStrategy
from tasktrain.strategies.world import ProcessWorld

__all__ = ["Strategy", "OneProcess", "ProcessWorld", "MultiProcess", "Sharded", "ClipsInsideStep", "Plan", "GradientClip", "DDP",
           "Precision", "SingleDevice", "SingleDeviceStrategy"]


def __getattr__(name):
    # Lightning's `from lightning.pytorch.strategies import ModelParallelStrategy` under the rename rule (its tensor
    # parallel example), imported only when asked for: it brings FSDP2 and DTensor
    if name == "ModelParallelStrategy":
        from tasktrain.strategies.model_parallel import ModelParallelStrategy

        return ModelParallelStrategy
    if name in ("DeepSpeedStrategy", "FSDPStrategy"):  # Lightning's classes, with their arguments (lightning.py)
        from tasktrain.strategies import lightning

        return getattr(lightning, name)
    if name == "DDPStrategy":  # Lightning's name: DDP takes its keyword arguments (find_unused_parameters, ddp_comm_*)
        return DDP
    raise AttributeError(f"module 'tasktrain.strategies' has no attribute {name!r}")
