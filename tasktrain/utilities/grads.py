"""Lightning's `lightning.pytorch.utilities.grads` path: tasktrain/compat/lightning/utilities/grads.py (this name is that
very module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.grads")
