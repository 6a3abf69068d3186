"""Lightning's `lightning.pytorch.utilities.model_registry` path: tasktrain/compat/lightning/utilities/model_registry.py (this name is that
very module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.model_registry")
