"""Accelerate's `accelerate.utils.imports` path: tasktrain/compat/accelerate/utils/imports.py (this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.accelerate.utils.imports")
