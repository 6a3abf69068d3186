"""Accelerate's `accelerate.accelerator` path under the rename rule (`from tasktrain.accelerator import Accelerator,
DataLoaderConfiguration, GradientAccumulationPlugin`): tasktrain/compat/accelerate/accelerator.py (this name is that
module; tasktrain.Accelerator is its class)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.accelerate.accelerator")
