"""Accelerate's `accelerate.local_sgd` path under the rename rule (`from tasktrain.local_sgd import LocalSGD`):
tasktrain/compat/accelerate/local_sgd.py (this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.accelerate.local_sgd")
