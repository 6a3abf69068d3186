"""`lightning.pytorch.core.module` renamed: TaskModule (defined in tasktrain.trainer.module)."""
from tasktrain.trainer.module import TaskModule

__all__ = ["TaskModule"]
