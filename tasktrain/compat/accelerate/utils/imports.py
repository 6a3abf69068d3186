"""Accelerate's `is_*_available` checks (`accelerate.utils.imports` -> `tasktrain.utils.imports`, and
`tasktrain.utils`), answered honestly for this process: a hardware check is True only where torch (or its vendor
plug-in) really sees such a device, a package check only where the package can be imported, and a precision
check says whether tasktrain's Accelerator runs that precision here (fp8: never, it is refused).

Nothing is imported until a check is called: `import tasktrain.utils` stays cheap.
"""
import functools
import importlib
import importlib.util

# the smaller checks written before this module, under the same names here
from tasktrain.compat.accelerate.utils.other import (  # noqa: F401
    is_cuda_available, is_deepspeed_available, is_mlflow_available, is_tensorboard_available, is_wandb_available)


def _has(module):
    """Whether `module` is installed (its spec is found; nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _imports(module):
    """Whether `module` imports without error (a vendor plug-in can be installed yet broken on this machine)."""
    if not _has(module):
        return False
    try:
        importlib.import_module(module)
    except Exception:  # any failure of a vendor's import means: not usable here
        return False
    return True


def _torch_device_available(name):
    """torch.<name>.is_available(), for the device modules torch (or a plug-in, once imported) registers."""
    import torch

    device = getattr(torch, name, None)
    try:
        return bool(device is not None and device.is_available())
    except RuntimeError:  # a driver that is present but cannot start counts as no device
        return False


# -- packages -----------------------------------------------------------------------------------------------------
def _package_check(module, doc_name=None):
    def check():
        return _has(module)

    check.__name__ = f"is_{doc_name or module}_available"
    check.__doc__ = f"Whether the `{module}` package is installed."
    return check


is_datasets_available = _package_check("datasets")
is_pytest_available = _package_check("pytest")
is_transformers_available = _package_check("transformers")
is_peft_available = _package_check("peft")
is_timm_available = _package_check("timm")
is_torchvision_available = _package_check("torchvision")
is_rich_available = _package_check("rich")
is_pandas_available = _package_check("pandas")
is_matplotlib_available = _package_check("matplotlib")
is_safetensors_available = _package_check("safetensors")
is_schedulefree_available = _package_check("schedulefree")  # the `schedulefree` extra (docs/accelerator.md)
is_torchdata_available = _package_check("torchdata")
is_comet_ml_available = _package_check("comet_ml")
is_aim_available = _package_check("aim")
is_clearml_available = _package_check("clearml")
is_dvclive_available = _package_check("dvclive")
is_swanlab_available = _package_check("swanlab")
is_trackio_available = _package_check("trackio")
is_bnb_available = _package_check("bitsandbytes", "bnb")
is_ipex_available = _package_check("intel_extension_for_pytorch", "ipex")


def is_torchdata_stateful_dataloader_available():
    """Whether torchdata's StatefulDataLoader (DataLoaderConfiguration(use_stateful_dataloader=True)) imports."""
    return _imports("torchdata.stateful_dataloader")


# -- hardware -----------------------------------------------------------------------------------------------------
def is_mps_available(min_version="1.12"):
    """Whether Apple's MPS device is built into torch and present (min_version: kept for Accelerate's signature;
    every torch tasktrain supports is newer)."""
    import torch

    return torch.backends.mps.is_built() and torch.backends.mps.is_available()


def is_xpu_available(check_device=False):
    """Whether an Intel XPU is present (torch.xpu)."""
    return _torch_device_available("xpu")


@functools.lru_cache(maxsize=None)
def _vendor_device(module, name):
    return _imports(module) and _torch_device_available(name)


def is_npu_available(check_device=False):
    """Whether Ascend's torch_npu imports and sees an NPU."""
    return _vendor_device("torch_npu", "npu")


def is_mlu_available(check_device=False):
    """Whether Cambricon's torch_mlu imports and sees an MLU."""
    return _vendor_device("torch_mlu", "mlu")


def is_musa_available(check_device=False):
    """Whether Moore Threads' torch_musa imports and sees a MUSA device."""
    return _vendor_device("torch_musa", "musa")


def is_sdaa_available(check_device=False):
    """Whether torch_sdaa imports and sees an SDAA device."""
    return _vendor_device("torch_sdaa", "sdaa")


def is_hpu_available(init_hccl=False):
    """Whether Habana's habana_frameworks.torch imports and sees an HPU."""
    return _vendor_device("habana_frameworks.torch", "hpu")


def is_neuron_available(check_device=False):
    """Whether AWS Neuron's torch_neuronx is installed."""
    return _has("torch_neuronx")


def is_torch_xla_available(check_is_tpu=False, check_is_gpu=False):
    """Whether torch_xla is installed (check_is_tpu / check_is_gpu: and its runtime's device is a TPU / GPU).
    tasktrain does not run on XLA; the check only tells what is installed."""
    if check_is_tpu and check_is_gpu:
        raise ValueError("is_torch_xla_available: pass check_is_tpu or check_is_gpu, not both.")
    if not _has("torch_xla"):
        return False
    if not (check_is_tpu or check_is_gpu):
        return True
    try:
        import torch_xla.runtime
        kind = torch_xla.runtime.device_type()
    except Exception:
        return False
    return kind == "TPU" if check_is_tpu else kind in ("GPU", "CUDA")


def is_rocm_available():
    """Whether this torch is built for AMD GPUs (ROCm) and sees one."""
    import torch

    return torch.version.hip is not None and torch.cuda.is_available()


# -- precisions ---------------------------------------------------------------------------------------------------
def is_bf16_available(ignore_tpu=False):
    """Whether Accelerator(mixed_precision="bf16") runs here: on a CUDA GPU that supports bf16, and on the CPU
    (torch's CPU autocast runs bf16)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    if is_xpu_available():
        return torch.xpu.is_bf16_supported()
    return True


def is_fp16_available():
    """Whether Accelerator(mixed_precision="fp16") runs here: on GPUs, and on the CPU (slow there: it warns)."""
    return True


def is_fp8_available():
    """False: tasktrain refuses mixed_precision="fp8" (Accelerator(mixed_precision="fp8") is a ValueError)."""
    return False
