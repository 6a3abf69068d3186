"""Accelerate's `accelerate.test_utils.testing` path: tasktrain/compat/accelerate/test_utils/testing.py (this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.accelerate.test_utils.testing")
