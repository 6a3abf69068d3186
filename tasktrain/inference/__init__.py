"""Inference of models bigger than one device: plan a device map, then dispatch (or load straight into) it."""
from tasktrain.inference.device_map import (
    available_cpu_memory,
    balanced_max_memory,
    infer_device_map,
    module_sizes,
    parse_size,
    resolve_max_memory,
)
from tasktrain.inference.dispatch import OffloadFolder, dispatch_model, load_checkpoint_and_dispatch

__all__ = [
    "OffloadFolder",
    "available_cpu_memory",
    "balanced_max_memory",
    "dispatch_model",
    "infer_device_map",
    "load_checkpoint_and_dispatch",
    "module_sizes",
    "parse_size",
    "resolve_max_memory",
]
