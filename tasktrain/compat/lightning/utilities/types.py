"""Type names Lightning scripts annotate with (`lightning.pytorch.utilities.types`)."""
from typing import Any, Dict, Iterable, NotRequired, Optional, Required, Sequence, TypedDict, Union

import torch
from torch.nn.parallel import DistributedDataParallel

from tasktrain.trainer.module import STEP_OUTPUT  # (the core's, which its hooks are annotated with)
TRAIN_DATALOADERS = Any  # a loader, or a collection of loaders
EVAL_DATALOADERS = Any
OptimizerLRScheduler = Optional[Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer], Dict[str, Any],
                                      Iterable[Any]]]
LRSchedulerTypeUnion = Any


class LRSchedulerConfigType(TypedDict, total=False):
    """The dict form of a scheduler in configure_optimizers' return (the keys the Trainer reads)."""
    scheduler: Required[LRSchedulerTypeUnion]
    name: Optional[str]
    interval: str
    frequency: int
    reduce_on_plateau: bool
    monitor: Optional[str]
    strict: bool


class OptimizerConfig(TypedDict):
    optimizer: torch.optim.Optimizer


class OptimizerLRSchedulerConfig(TypedDict):
    optimizer: torch.optim.Optimizer
    lr_scheduler: Union[LRSchedulerTypeUnion, LRSchedulerConfigType]
    monitor: NotRequired[str]

__all__ = ["STEP_OUTPUT", "TRAIN_DATALOADERS", "EVAL_DATALOADERS", "OptimizerLRScheduler", "LRSchedulerTypeUnion",
           "LRSchedulerConfig", "LRSchedulerConfigType", "OptimizerConfig", "OptimizerLRSchedulerConfig",
           "DistributedDataParallel"]


def __getattr__(name):
    if name == "LRSchedulerConfig":  # what trainer.lr_scheduler_configs hold (the core's class, read when asked)
        from tasktrain.trainer.optim import SchedulerConfig

        return SchedulerConfig
    raise AttributeError(name)
