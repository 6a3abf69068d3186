"""Accelerate's `accelerate.launchers` path: tasktrain/compat/accelerate/launchers.py (this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.accelerate.launchers")
