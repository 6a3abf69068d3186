"""Lightning's `lightning.pytorch.utilities.combined_loader` path: tasktrain/compat/lightning/utilities/combined_loader.py
(this name is that very module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.combined_loader")
