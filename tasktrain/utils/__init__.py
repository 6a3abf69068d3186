"""Accelerate's `accelerate.utils` names under the rename rule (`from tasktrain.utils import set_seed, gather`).

Names load on first use (`import tasktrain.utils` imports no torch module of ours). docs/accelerator.md lists
what is supported, partly supported or refused; tests/test_accelerate_compat.py walks that list.
"""
import importlib

_NAMES = {
    # configuration objects and enums
    "DistributedType": "tasktrain.utils.dataclasses",
    "PrecisionType": "tasktrain.utils.dataclasses",
    "RNGType": "tasktrain.utils.dataclasses",
    "LoggerType": "tasktrain.utils.dataclasses",
    "KwargsHandler": "tasktrain.utils.dataclasses",
    "AutocastKwargs": "tasktrain.utils.dataclasses",
    "DistributedDataParallelKwargs": "tasktrain.utils.dataclasses",
    "GradScalerKwargs": "tasktrain.utils.dataclasses",
    "InitProcessGroupKwargs": "tasktrain.utils.dataclasses",
    "ProfileKwargs": "tasktrain.utils.dataclasses",
    "DataLoaderConfiguration": "tasktrain.utils.dataclasses",
    "ProjectConfiguration": "tasktrain.utils.dataclasses",
    "GradientAccumulationPlugin": "tasktrain.utils.dataclasses",
    "DeepSpeedPlugin": "tasktrain.utils.dataclasses",
    "FullyShardedDataParallelPlugin": "tasktrain.utils.dataclasses",
    # collectives
    "gather": "tasktrain.utils.operations",
    "gather_object": "tasktrain.utils.operations",
    "broadcast": "tasktrain.utils.operations",
    "broadcast_object_list": "tasktrain.utils.operations",
    "reduce": "tasktrain.utils.operations",
    "pad_across_processes": "tasktrain.utils.operations",
    "send_to_device": "tasktrain.utils.operations",
    "wait_for_everyone": "tasktrain.utils.operations",
    # memory
    "find_executable_batch_size": "tasktrain.utils.memory",
    "release_memory": "tasktrain.utils.memory",
    # the rest
    "set_seed": "tasktrain.utils.other",
    "tqdm": "tasktrain.utils.other",
    "extract_model_from_parallel": "tasktrain.utils.other",
    "write_basic_config": "tasktrain.utils.other",
    "notebook_launcher": "tasktrain.utils.other",
    "patch_environment": "tasktrain.utils.other",
    "is_tensorboard_available": "tasktrain.utils.other",
    "is_wandb_available": "tasktrain.utils.other",
    "is_mlflow_available": "tasktrain.utils.other",
    "is_deepspeed_available": "tasktrain.utils.other",
    "is_cuda_available": "tasktrain.utils.other",
}

__all__ = list(_NAMES)


def __getattr__(name):
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tasktrain.utils' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
