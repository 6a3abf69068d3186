"""Lightning's `lightning.pytorch.utilities.types` path: tasktrain/compat/lightning/utilities/types.py (this name is that
module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.types")
