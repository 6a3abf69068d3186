"""Lightning's `lightning.pytorch.utilities.data` path: this name is the very module
tasktrain/compat/lightning/utilities/data.py."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.data")
