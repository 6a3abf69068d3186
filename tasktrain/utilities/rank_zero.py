"""Lightning's `lightning.pytorch.utilities.rank_zero` path: tasktrain/compat/lightning/utilities/rank_zero.py (this name is that
module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.rank_zero")
