"""Lightning's `lightning.pytorch.utilities.argparse` path: this name is the very module
tasktrain/compat/lightning/utilities/argparse.py."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.utilities.argparse")
