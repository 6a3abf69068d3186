"""Lightning's `lightning.pytorch.utilities.parameter_tying` path: this name is the very module
tasktrain/compat/lightning/utilities/parameter_tying.py."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.parameter_tying")
