"""Lightning's `lightning.pytorch.core` path, renamed (docs/lightning.md): `from tasktrain.core import TaskModule,
DataModule`, and `tasktrain.core.module` / `tasktrain.core.datamodule` for the modules that define them."""
from tasktrain.compat.lightning.core.datamodule import DataModule
from tasktrain.compat.lightning.core.module import TaskModule

__all__ = ["DataModule", "TaskModule"]
