"""Lightning's `lightning.pytorch.core.optimizer` path: LightningOptimizer and do_nothing_closure (defined in
tasktrain.trainer.optim; this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.trainer.optim")
