"""Accelerate's `accelerate.utils.other` path: tasktrain/compat/accelerate/utils/other.py (this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.accelerate.utils.other")
