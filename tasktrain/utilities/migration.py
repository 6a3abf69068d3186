"""Lightning's `lightning.pytorch.utilities.migration` path: tasktrain/compat/lightning/utilities/migration.py (this name is that
very module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.migration")
