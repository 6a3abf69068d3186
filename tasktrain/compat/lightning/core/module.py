"""`lightning.pytorch.core.module` renamed: TaskModule (defined in tasktrain.trainer.module), and Lightning's
`_TrainerFabricShim` refused when created.

Lightning's shim stands in for `module.trainer` while a LightningModule runs under Lightning Fabric; a tasktrain module
never does (`module.fabric = fabric` raises, `module.fabric` is None), so no shim is ever made. The name is importable
(scripts and tests import it beside TaskModule) and creating one raises the same refusal, naming what to use."""
from tasktrain.trainer.module import TaskModule

__all__ = ["TaskModule"]


class _TrainerFabricShim:
    """Lightning's `module.trainer` under Fabric: refused, as a tasktrain module does not run under Fabric."""

    def __init__(self, fabric=None):
        raise TypeError(f"_TrainerFabricShim({type(fabric).__name__}): a tasktrain module does not run under "
                        "Lightning Fabric (TaskModule.fabric = ... is refused alike), so it has no Fabric trainer "
                        "shim; train it with tasktrain.Trainer (or tasktrain.Accelerator).")
