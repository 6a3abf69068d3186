"""Accelerate's `accelerate.utils.memory` path: tasktrain/compat/accelerate/utils/memory.py (this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.accelerate.utils.memory")
