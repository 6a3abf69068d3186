"""Lightning's `lightning.pytorch.callbacks.rich_model_summary` path (where its RichModelSummary lives): this name is
tasktrain.callbacks.model_summary itself."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.callbacks.model_summary")
