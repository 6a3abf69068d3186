"""Accelerate's `accelerate.accelerator` module path under the rename rule (`from tasktrain.accelerator import
Accelerator, DataLoaderConfiguration, GradientAccumulationPlugin`): the Accelerator (tasktrain.Accelerator, the
very class) and the names Accelerate's scripts import from that module."""
from tasktrain.compat.accelerate.accelerator import Accelerator  # noqa: F401
from tasktrain.compat.accelerate.state import AcceleratorState, GradientState, PartialState  # noqa: F401
from tasktrain.compat.accelerate.utils.dataclasses import (  # noqa: F401
    AutocastKwargs, DataLoaderConfiguration, DeepSpeedPlugin, DistributedDataParallelKwargs, DistributedType,
    FullyShardedDataParallelPlugin, GradientAccumulationPlugin, GradScalerKwargs, InitProcessGroupKwargs,
    KwargsHandler, PrecisionType, ProfileKwargs, ProjectConfiguration, RNGType)
from tasktrain.trainer.accelerator import skip_first_batches  # noqa: F401

__all__ = ["Accelerator", "AcceleratorState", "GradientState", "PartialState", "AutocastKwargs",
           "DataLoaderConfiguration", "DeepSpeedPlugin", "DistributedDataParallelKwargs", "DistributedType",
           "FullyShardedDataParallelPlugin", "GradientAccumulationPlugin", "GradScalerKwargs",
           "InitProcessGroupKwargs", "KwargsHandler", "PrecisionType", "ProfileKwargs", "ProjectConfiguration",
           "RNGType", "skip_first_batches"]
