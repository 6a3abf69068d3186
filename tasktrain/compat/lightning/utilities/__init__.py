"""Utilities a Lightning user imports from `lightning.pytorch.utilities` (the same names here), and its submodules
(argparse, compile, data, enums, exceptions, grads, imports, memory, migration, model_registry, parameter_tying,
parsing, rank_zero, seed, signature_utils, types, warnings) under the same names."""
import os

import torch

from tasktrain.compat.lightning.utilities.enums import GradClipAlgorithmType, LightningEnum
from tasktrain.compat.lightning.utilities.grads import grad_norm
from tasktrain.compat.lightning.utilities.parameter_tying import find_shared_parameters, set_shared_parameters
from tasktrain.compat.lightning.utilities.parsing import AttributeDict, is_picklable
from tasktrain.compat.lightning.utilities.rank_zero import (rank_zero_debug, rank_zero_deprecation, rank_zero_info,
                                                         rank_zero_only, rank_zero_warn)
from tasktrain.compat.lightning.utilities.combined_loader import CombinedLoader
from tasktrain.compat.lightning.utilities.warnings import disable_possible_user_warnings
from tasktrain.strategies.base import move_to_device as _move_to_device
from tasktrain.trainer.module import is_overridden
from tasktrain.trainer.data import suggested_max_num_workers

__all__ = ["AttributeDict", "CombinedLoader", "FLOAT16_EPSILON", "FLOAT32_EPSILON", "FLOAT64_EPSILON", "GradClipAlgorithmType",
           "LightningEnum", "disable_possible_user_warnings", "find_shared_parameters", "grad_norm", "is_overridden",
           "is_picklable", "is_shared_filesystem", "measure_flops", "move_data_to_device", "rank_zero_debug",
           "rank_zero_deprecation", "rank_zero_info", "rank_zero_only", "rank_zero_warn", "set_shared_parameters",
           "suggested_max_num_workers"]

FLOAT16_EPSILON = torch.finfo(torch.float16).eps
FLOAT32_EPSILON = torch.finfo(torch.float32).eps
FLOAT64_EPSILON = torch.finfo(torch.float64).eps


def move_data_to_device(batch, device):
    """Tensors in lists, tuples, dicts (and objects with their own .to) moved to `device`."""
    return _move_to_device(batch, torch.device(device))


def measure_flops(model, forward_fn, loss_fn=None):
    """The FLOPs torch's FlopCounterMode counts while forward_fn() runs (and, with loss_fn, loss_fn(output)
    .backward() too): a training step's or an inference's FLOPs. A model built under `torch.device("meta")` is
    measured without computing anything. `model` is not used (Lightning's signature keeps it)."""
    from tasktrain.callbacks.throughput_monitor import measure_flops as count_flops  # the core's counter

    def run():
        output = forward_fn()
        if loss_fn is not None:
            loss_fn(output).backward()

    flops, _ = count_flops(run)
    return flops


def is_shared_filesystem(strategy, path=None, timeout=3):
    """Whether `path` (default: the working directory) is one file system seen by every process of the strategy's
    run: rank 0 creates a file there and each rank looks for it for up to `timeout` seconds. Every rank calls it (it
    runs collectives); a remote URL ("s3://...") and a run of one process are shared without a check."""
    import time
    from pathlib import Path

    if path is not None and "://" in str(path) and not str(path).startswith("file://"):
        return True
    path = Path(Path.cwd() if path is None else path).resolve()
    if strategy.world_size == 1:
        return True
    if not strategy.reduce_boolean_decision(strategy.broadcast(path) == path, all=True):
        return False  # the path itself differs between ranks
    if not strategy.reduce_boolean_decision(path.exists(), all=True):
        raise FileNotFoundError(f"Unable to determine if the path belongs to a shared filesystem. The path does not "
                                f"exist: {path}")
    folder = path.parent if path.is_file() else path
    marker = folder / ".lightning_shared_fs_check"
    marker.unlink(missing_ok=True)
    strategy.barrier()
    if strategy.is_global_zero:
        marker.touch()
        found = True
    else:
        deadline = time.perf_counter() + timeout
        found = marker.exists()
        while not found and time.perf_counter() < deadline:
            found = marker.exists()
    strategy.barrier()
    shared = strategy.reduce_boolean_decision(found, all=True)
    try:
        marker.unlink()
    except OSError:  # another rank removed it first
        pass
    return shared
