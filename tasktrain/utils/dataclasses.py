"""Accelerate's `accelerate.utils.dataclasses` path: tasktrain/compat/accelerate/utils/dataclasses.py (this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.accelerate.utils.dataclasses")
