"""Lightning's `lightning.pytorch.utilities.compile` path: this name is the very module
tasktrain/compat/lightning/utilities/compile.py."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.compile")
