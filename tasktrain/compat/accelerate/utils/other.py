"""The smaller `accelerate.utils` helpers: set_seed, tqdm, extract_model_from_parallel, patch_environment, the
is_*_available checks, write_basic_config (the default config file `tasktrain launch` reads)."""
import importlib.util
import os


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False):
    """Seed python, numpy and torch (tasktrain.seed_everything, which also fixes the data order). device_specific
    adds the process index, so that each process draws differently; deterministic asks torch for deterministic
    algorithms."""
    import torch

    from tasktrain.trainer.seed import seed_everything

    if device_specific:
        from tasktrain.compat.accelerate.state import PartialState

        seed += PartialState().process_index
    seed_everything(seed, verbose=False)  # Accelerate's set_seed says nothing
    if deterministic:
        torch.use_deterministic_algorithms(True)


def tqdm(*args, main_process_only: bool = True, **kwargs):
    """tqdm.auto.tqdm, shown on the main process only (main_process_only=False: on every process)."""
    from tqdm.auto import tqdm as _tqdm

    if main_process_only:
        from tasktrain.compat.accelerate.state import PartialState

        kwargs["disable"] = kwargs.get("disable", False) or not PartialState().is_local_main_process
    return _tqdm(*args, **kwargs)


def extract_model_from_parallel(model, keep_fp32_wrapper: bool = True):
    """The user's model inside a DDP/DeepSpeed wrapper (Accelerator.unwrap_model without an Accelerator)."""
    from tasktrain.compat.accelerate.state import PartialState
    from tasktrain.strategies.precision import unpatch_forward

    model = PartialState()._strategy.unwrap_model(model)
    if not keep_fp32_wrapper:
        unpatch_forward(model)
    return model


def patch_environment(**kwargs):
    """Set environment variables (names upper-cased) inside the block; restore the old values after."""
    from tasktrain.strategies.function_launcher import patched_environment

    return patched_environment({key.upper(): value for key, value in kwargs.items()})


def write_basic_config(mixed_precision="no", save_location=None):
    """Write a launch config for this machine, as Accelerate's does: every GPU of it (DDP when there are several),
    else one CPU process, with `mixed_precision` ("no", "fp16", "bf16"). save_location defaults to the file that
    `tasktrain launch` reads when no --config_file is given ($TASKTRAIN_CONFIG_DIR/default_config.yaml, else
    ~/.cache/tasktrain/default_config.yaml; Accelerate's own default is under ~/.cache/huggingface). Returns the
    path written, or False (with a message) when a file is there already: it is never overwritten."""
    import torch

    from tasktrain.cli import config as cfg

    path = os.path.abspath(os.path.expanduser(os.fspath(save_location or cfg.default_config_path())))
    if os.path.exists(path):
        print(f"Configuration already exists at {path}, will not override. Run `tasktrain config` or pass another "
              "save_location.")
        return False
    precision = str(mixed_precision).lower()
    if precision not in ("no", "fp16", "bf16"):
        raise ValueError(f"write_basic_config(mixed_precision={mixed_precision!r}): use 'no', 'fp16' or 'bf16' "
                         "(fp8 is not supported).")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    values = {"compute_environment": "LOCAL_MACHINE", "mixed_precision": precision,
              "num_processes": gpus if gpus else 1, "use_cpu": not gpus,
              "distributed_type": "MULTI_GPU" if gpus > 1 else "NO", "debug": False, "enable_cpu_affinity": False}
    cfg.check_keys(values, where=path)  # what `tasktrain launch` will read
    return cfg.write_config(values, path)


# Accelerate's launcher (start processes from a notebook) lives at its own path, accelerate.launchers; this
# module's name (tasktrain.utils.notebook_launcher) is the same function.
from tasktrain.compat.accelerate.launchers import notebook_launcher  # noqa: E402,F401


def _has(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def is_tensorboard_available():
    return _has("tensorboard")


def is_wandb_available():
    return _has("wandb")


def is_mlflow_available():
    return _has("mlflow")


def is_deepspeed_available():
    return _has("deepspeed")


def is_cuda_available():
    import torch

    return torch.cuda.is_available()
