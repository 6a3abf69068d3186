"""Lightning's `lightning.pytorch.utilities.exceptions` path: tasktrain/compat/lightning/utilities/exceptions.py (this
name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.exceptions")
