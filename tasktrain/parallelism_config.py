"""Accelerate's `accelerate.parallelism_config` path under the rename rule (`from tasktrain.parallelism_config import
ParallelismConfig`, as Accelerate's torch_native_parallelism examples import it): tasktrain/compat/accelerate/
parallelism_config.py (this name is that module)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.accelerate.parallelism_config")
