"""Accelerate's save_state file layout lives in tasktrain/compat/accelerate/layout.py (this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.accelerate.layout")
