"""Lightning's `lightning.pytorch.core.saving` path: tasktrain/compat/lightning/core/saving.py (this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.core.saving")
