"""Accelerate's `accelerate.data_loader` path under the rename rule: tasktrain/compat/accelerate/data_loader.py (this
name is that very module)."""
import sys

from tasktrain.compat.accelerate import data_loader as _data_loader

sys.modules[__name__] = _data_loader
