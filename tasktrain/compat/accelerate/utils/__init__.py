"""Accelerate's `accelerate.utils` names under the rename rule (`from tasktrain.utils import set_seed, gather`).

Names load on first use (`import tasktrain.utils` imports no torch module of ours). docs/accelerator.md lists
what is supported, partly supported or refused; tests/test_accelerate_compat.py walks that list.
"""
import importlib

_NAMES = {
    # configuration objects and enums
    "DistributedType": "tasktrain.compat.accelerate.utils.dataclasses",
    "PrecisionType": "tasktrain.compat.accelerate.utils.dataclasses",
    "RNGType": "tasktrain.compat.accelerate.utils.dataclasses",
    "LoggerType": "tasktrain.compat.accelerate.utils.dataclasses",
    "KwargsHandler": "tasktrain.compat.accelerate.utils.dataclasses",
    "AutocastKwargs": "tasktrain.compat.accelerate.utils.dataclasses",
    "DistributedDataParallelKwargs": "tasktrain.compat.accelerate.utils.dataclasses",
    "DDPCommunicationHookType": "tasktrain.compat.accelerate.utils.dataclasses",
    "GradScalerKwargs": "tasktrain.compat.accelerate.utils.dataclasses",
    "InitProcessGroupKwargs": "tasktrain.compat.accelerate.utils.dataclasses",
    "ProfileKwargs": "tasktrain.compat.accelerate.utils.dataclasses",
    "DataLoaderConfiguration": "tasktrain.compat.accelerate.utils.dataclasses",
    "ProjectConfiguration": "tasktrain.compat.accelerate.utils.dataclasses",
    "GradientAccumulationPlugin": "tasktrain.compat.accelerate.utils.dataclasses",
    "DeepSpeedPlugin": "tasktrain.compat.accelerate.utils.dataclasses",
    "FullyShardedDataParallelPlugin": "tasktrain.compat.accelerate.utils.dataclasses",
    "TorchDynamoPlugin": "tasktrain.compat.accelerate.utils.dataclasses",
    "DynamoBackend": "tasktrain.compat.accelerate.utils.dataclasses",
    "TorchContextParallelConfig": "tasktrain.compat.accelerate.parallelism_config",  # issue 39
    # collectives
    "gather": "tasktrain.compat.accelerate.utils.operations",
    "gather_object": "tasktrain.compat.accelerate.utils.operations",
    "broadcast": "tasktrain.compat.accelerate.utils.operations",
    "broadcast_object_list": "tasktrain.compat.accelerate.utils.operations",
    "reduce": "tasktrain.compat.accelerate.utils.operations",
    "pad_across_processes": "tasktrain.compat.accelerate.utils.operations",
    "send_to_device": "tasktrain.compat.accelerate.utils.operations",
    "wait_for_everyone": "tasktrain.compat.accelerate.utils.operations",
    "copy_tensor_to_devices": "tasktrain.compat.accelerate.utils.operations",
    "DistributedOperationException": "tasktrain.compat.accelerate.utils.operations",
    # random states
    "synchronize_rng_state": "tasktrain.compat.accelerate.utils.random",
    "synchronize_rng_states": "tasktrain.compat.accelerate.utils.random",
    # memory
    "find_executable_batch_size": "tasktrain.compat.accelerate.utils.memory",
    "release_memory": "tasktrain.compat.accelerate.utils.memory",
    # the rest
    "set_seed": "tasktrain.compat.accelerate.utils.other",
    "tqdm": "tasktrain.compat.accelerate.utils.other",
    "extract_model_from_parallel": "tasktrain.compat.accelerate.utils.other",
    "write_basic_config": "tasktrain.compat.accelerate.utils.other",
    "notebook_launcher": "tasktrain.compat.accelerate.utils.other",
    "patch_environment": "tasktrain.compat.accelerate.utils.other",
    "is_tensorboard_available": "tasktrain.compat.accelerate.utils.other",
    "is_wandb_available": "tasktrain.compat.accelerate.utils.other",
    "is_mlflow_available": "tasktrain.compat.accelerate.utils.other",
    "is_deepspeed_available": "tasktrain.compat.accelerate.utils.other",
    "is_cuda_available": "tasktrain.compat.accelerate.utils.other",
    # the other is_*_available checks (hardware, packages, precisions): tasktrain/compat/accelerate/utils/imports.py
    "is_aim_available": "tasktrain.compat.accelerate.utils.imports",
    "is_bf16_available": "tasktrain.compat.accelerate.utils.imports",
    "is_bnb_available": "tasktrain.compat.accelerate.utils.imports",
    "is_clearml_available": "tasktrain.compat.accelerate.utils.imports",
    "is_comet_ml_available": "tasktrain.compat.accelerate.utils.imports",
    "is_datasets_available": "tasktrain.compat.accelerate.utils.imports",
    "is_dvclive_available": "tasktrain.compat.accelerate.utils.imports",
    "is_fp16_available": "tasktrain.compat.accelerate.utils.imports",
    "is_fp8_available": "tasktrain.compat.accelerate.utils.imports",
    "is_hpu_available": "tasktrain.compat.accelerate.utils.imports",
    "is_ipex_available": "tasktrain.compat.accelerate.utils.imports",
    "is_matplotlib_available": "tasktrain.compat.accelerate.utils.imports",
    "is_mlu_available": "tasktrain.compat.accelerate.utils.imports",
    "is_mps_available": "tasktrain.compat.accelerate.utils.imports",
    "is_musa_available": "tasktrain.compat.accelerate.utils.imports",
    "is_neuron_available": "tasktrain.compat.accelerate.utils.imports",
    "is_npu_available": "tasktrain.compat.accelerate.utils.imports",
    "is_pandas_available": "tasktrain.compat.accelerate.utils.imports",
    "is_peft_available": "tasktrain.compat.accelerate.utils.imports",
    "is_pytest_available": "tasktrain.compat.accelerate.utils.imports",
    "is_rich_available": "tasktrain.compat.accelerate.utils.imports",
    "is_rocm_available": "tasktrain.compat.accelerate.utils.imports",
    "is_safetensors_available": "tasktrain.compat.accelerate.utils.imports",
    "is_schedulefree_available": "tasktrain.compat.accelerate.utils.imports",
    "is_sdaa_available": "tasktrain.compat.accelerate.utils.imports",
    "is_swanlab_available": "tasktrain.compat.accelerate.utils.imports",
    "is_timm_available": "tasktrain.compat.accelerate.utils.imports",
    "is_torch_xla_available": "tasktrain.compat.accelerate.utils.imports",
    "is_torchdata_available": "tasktrain.compat.accelerate.utils.imports",
    "is_torchdata_stateful_dataloader_available": "tasktrain.compat.accelerate.utils.imports",
    "is_torchvision_available": "tasktrain.compat.accelerate.utils.imports",
    "is_trackio_available": "tasktrain.compat.accelerate.utils.imports",
    "is_transformers_available": "tasktrain.compat.accelerate.utils.imports",
    "is_xpu_available": "tasktrain.compat.accelerate.utils.imports",
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
