"""Accelerate's `accelerate.utils.operations` path: tasktrain/compat/accelerate/utils/operations.py (this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.accelerate.utils.operations")
