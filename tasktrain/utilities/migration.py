"""Lightning's `lightning.pytorch.utilities.migration` path: this name is the very module
tasktrain/compat/lightning/utilities/migration.py."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.migration")
