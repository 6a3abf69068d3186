"""`lightning.pytorch.core.datamodule` renamed: DataModule (defined in tasktrain.trainer.datamodule)."""
from tasktrain.trainer.datamodule import DataModule

__all__ = ["DataModule"]
