"""Lightning's `lightning.pytorch.utilities.parameter_tying` path: tasktrain/compat/lightning/utilities/parameter_tying.py (this name is that
very module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.parameter_tying")
