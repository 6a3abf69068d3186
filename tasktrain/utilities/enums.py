"""Lightning's `lightning.pytorch.utilities.enums` path: this name is the very module
tasktrain/compat/lightning/utilities/enums.py."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.enums")
