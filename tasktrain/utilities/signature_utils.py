"""Lightning's `lightning.pytorch.utilities.signature_utils` path: this name is the very module
tasktrain/compat/lightning/utilities/signature_utils.py."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.signature_utils")
