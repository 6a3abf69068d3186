"""Inference of models bigger than one device: plan a device map, then dispatch (or load straight into) it.

Also the Hugging Face checkpoint layout both ways: `load_checkpoint_and_dispatch` reads .safetensors and torch files,
sharded or not, and `save_model` writes them. safetensors itself is imported only when such a file is read or written.
"""
from tasktrain.inference.device_map import (
    available_cpu_memory,
    balanced_max_memory,
    infer_device_map,
    module_sizes,
    parse_size,
    resolve_max_memory,
)
from tasktrain.inference.dispatch import OffloadFolder, dispatch_model, load_checkpoint_and_dispatch
from tasktrain.inference.empty import init_empty_weights
from tasktrain.inference.saving import save_model

__all__ = [
    "OffloadFolder",
    "available_cpu_memory",
    "balanced_max_memory",
    "dispatch_model",
    "infer_device_map",
    "init_empty_weights",
    "load_checkpoint_and_dispatch",
    "module_sizes",
    "parse_size",
    "resolve_max_memory",
    "save_model",
]
