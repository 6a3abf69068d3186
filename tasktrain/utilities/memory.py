"""Lightning's `lightning.pytorch.utilities.memory` path: this name is the very module
tasktrain/compat/lightning/utilities/memory.py."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.memory")
