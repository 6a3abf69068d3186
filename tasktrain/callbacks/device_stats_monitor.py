"""DeviceStatsMonitor: write the device's statistics to the loggers around every training, validation and test batch
of a log step, as Lightning's callback does.

Keys: "DeviceStatsMonitor.<hook>/<statistic>" (the separator is each logger's `group_separator`), for the hooks
on_train_batch_start/end, on_validation_batch_start/end and on_test_batch_start/end. The statistics are those
Lightning's accelerator of the device reports: on CUDA `torch.cuda.memory_stats(device)` (bytes, counts); on the CPU
psutil's cpu_percent, cpu_vm_percent and cpu_swap_percent (tasktrain/accelerators/cpu.py); on MPS the same three
under Lightning's "M1_" names.

Written at Lightning's points: in training on the batches where trainer.should_update_logs holds (the batch about to
be counted a multiple of `log_every_n_steps`); in validation and test on the batches whose number in that evaluation
run (from 1, all loaders together) is a multiple of it (or once the trainer should stop). At Lightning's logging step:
trainer.state.batches_that_stepped as it was at the last training batch's end (the epoch-end validation runs after
tasktrain counted that batch, before Lightning does). Straight to each logger (no "epoch" key, not in
logged_metrics), on every rank (tasktrain's loggers write on rank 0).

cpu_stats: None logs the CPU's statistics only when training on the CPU; True adds them on any device; False never
logs them (on the CPU: nothing is logged at all).
"""
from typing import Optional

import torch

from tasktrain.accelerators import cpu
from tasktrain.accelerators.cpu import _PSUTIL_AVAILABLE
from tasktrain.callbacks.base import Callback
from tasktrain.exceptions import MisconfigurationException

_MPS_NAMES = {cpu._CPU_VM_PERCENT: "M1_vm_percent", cpu._CPU_PERCENT: "M1_percent",
              cpu._CPU_SWAP_PERCENT: "M1_swap_percent"}


def _device_stats(device):
    """What Lightning's accelerator for `device` reports from get_device_stats."""
    if device.type == "cuda":
        return torch.cuda.memory_stats(device)
    if device.type == "mps":
        return {_MPS_NAMES[k]: v for k, v in cpu.get_cpu_stats().items()}
    if device.type == "cpu":
        return cpu.get_cpu_stats()  # looked up at call time: the module's function, as a test may replace it
    return {}


def _prefix_metric_keys(metrics_dict, prefix, separator):
    return {prefix + separator + k: v for k, v in metrics_dict.items()}


class DeviceStatsMonitor(Callback):
    def __init__(self, cpu_stats: Optional[bool] = None):
        self._cpu_stats = cpu_stats
        self._eval_batches = 0  # batches of the current evaluation run: Lightning's batch_progress.current.ready
        self._train_step = None  # in a fit's training: batches_that_stepped at the last on_train_batch_end

    def setup(self, trainer, pl_module, stage):
        if stage != "fit":
            return
        if not trainer.loggers:
            raise MisconfigurationException("Cannot use `DeviceStatsMonitor` callback with `Trainer(logger=False)`. "
                                            "Give the Trainer a logger (e.g. CSVLogger) or remove the callback.")
        # Lightning checks only the default case here (cpu_stats=True without psutil fails at the first batch):
        # both are checked before training
        device = trainer.strategy.root_device
        if (self._cpu_stats is None and device.type == "cpu" or self._cpu_stats) and not _PSUTIL_AVAILABLE:
            raise ModuleNotFoundError("`DeviceStatsMonitor` cannot log CPU stats as `psutil` is not installed: "
                                      "`pip install psutil`, or pass DeviceStatsMonitor(cpu_stats=False).")

    def _should_log(self, trainer, key):
        if key.startswith("on_train"):
            return trainer.should_update_logs
        n = trainer.log_every_n_steps
        return bool(n) and (self._eval_batches % n == 0 or bool(trainer.should_stop))

    def _get_and_log_device_stats(self, trainer, key):
        if not self._should_log(trainer, key):
            return
        device = trainer.strategy.root_device
        if self._cpu_stats is False and device.type == "cpu":
            return
        step = trainer.state.batches_that_stepped
        if self._train_step is not None and not key.startswith("on_train"):  # a validation inside fit
            step = self._train_step
        stats = dict(_device_stats(device))
        if self._cpu_stats and device.type != "cpu":  # on the CPU they are the device's own: read once
            stats.update(cpu.get_cpu_stats())
        for logger in trainer.loggers:
            prefixed = _prefix_metric_keys(stats, f"{type(self).__qualname__}.{key}", logger.group_separator)
            logger.log_metrics(prefixed, step=step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._get_and_log_device_stats(trainer, "on_train_batch_start")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._train_step = trainer.state.batches_that_stepped
        self._get_and_log_device_stats(trainer, "on_train_batch_end")

    def on_train_start(self, trainer, pl_module):
        self._train_step = trainer.state.batches_that_stepped

    def on_train_end(self, trainer, pl_module):
        self._train_step = None

    def on_validation_start(self, trainer, pl_module):
        self._eval_batches = 0

    def on_test_start(self, trainer, pl_module):
        self._eval_batches = 0

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._eval_batches += 1
        self._get_and_log_device_stats(trainer, "on_validation_batch_start")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._get_and_log_device_stats(trainer, "on_validation_batch_end")

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._eval_batches += 1
        self._get_and_log_device_stats(trainer, "on_test_batch_start")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._get_and_log_device_stats(trainer, "on_test_batch_end")
