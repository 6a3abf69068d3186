"""Lightning's `lightning.pytorch.utilities.parsing` path: tasktrain/compat/lightning/utilities/parsing.py (this name is that
very module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.parsing")
