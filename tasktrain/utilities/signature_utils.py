"""Lightning's `lightning.pytorch.utilities.signature_utils` path: tasktrain/compat/lightning/utilities/signature_utils.py (this name is that
very module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.signature_utils")
