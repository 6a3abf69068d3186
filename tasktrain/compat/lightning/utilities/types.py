"""Type names Lightning scripts annotate with (`lightning.pytorch.utilities.types`)."""
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Union

import torch

STEP_OUTPUT = Optional[Union[torch.Tensor, Mapping[str, Any]]]
TRAIN_DATALOADERS = Any  # a loader, or a collection of loaders
EVAL_DATALOADERS = Any
OptimizerLRScheduler = Optional[Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer], Dict[str, Any],
                                      Iterable[Any]]]
LRSchedulerTypeUnion = Any

__all__ = ["STEP_OUTPUT", "TRAIN_DATALOADERS", "EVAL_DATALOADERS", "OptimizerLRScheduler", "LRSchedulerTypeUnion",
           "LRSchedulerConfig"]


def __getattr__(name):
    if name == "LRSchedulerConfig":  # what trainer.lr_scheduler_configs hold (the core's class, read when asked)
        from tasktrain.trainer.optim import SchedulerConfig

        return SchedulerConfig
    raise AttributeError(name)
