"""Lightning's `lightning.pytorch.utilities.model_registry` path: this name is the very module
tasktrain/compat/lightning/utilities/model_registry.py."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.model_registry")
