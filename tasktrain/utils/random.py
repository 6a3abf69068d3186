"""Accelerate's `accelerate.utils.random` path: tasktrain/compat/accelerate/utils/random.py (this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.accelerate.utils.random")
