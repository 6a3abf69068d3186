"""Lightning's `lightning.pytorch.utilities.model_helpers` path (where its is_overridden lives): this name is
tasktrain.trainer.module itself."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.trainer.module")
