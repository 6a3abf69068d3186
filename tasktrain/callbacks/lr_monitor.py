"""LearningRateMonitor: write each optimizer's learning rate to the trainer's loggers, named as Lightning names them.

Names, worked out at every write (so that param groups added during the fit, e.g. by BaseFinetuning, show up):
the optimizers with a scheduler first, in the schedulers' order, then the others; "lr-<Optimizer class>"
("lr-AdamW"), or the scheduler's "name"; "-1", "-2" for further optimizers of the same class; "/<group name>" when a
param group has a "name" key, else "/pg1", "/pg2", ... when there are several groups (the history of "lr-SGD" moves
to "lr-SGD/pg1" when a second group appears). Two groups of one optimizer with the same name are refused.

logging_interval="step": as in Lightning, at on_train_batch_start of the batches that are log steps (the batch about
to be counted, trainer.state.batches_that_stepped + 1, a multiple of log_every_n_steps), every optimizer's rate for
that step, written at batches_that_stepped (Lightning's logging step), without an "epoch" value.
logging_interval="epoch": at each epoch start, every optimizer's rate for that epoch.
logging_interval=None: an optimizer with a scheduler at its scheduler's interval; one without a scheduler at both.
Each written value is also put in trainer.callback_metrics (as a tensor): EarlyStopping or ModelCheckpoint can
monitor "lr-SGD".

log_momentum=True adds "<name>-momentum" (the group's `momentum`, or `betas[0]` for Adam-style optimizers; 0 with
a warning for an optimizer that has neither); log_weight_decay=True adds "<name>-weight_decay". They are written
with the rate, at the same points.

As in Lightning, `lrs` keeps the history ({name: [each rate written]}), `last_momentum_values` and
`last_weight_decay_values` the latest "<name>-momentum" / "<name>-weight_decay" values (None until written).
"""
import warnings
from collections import defaultdict
from typing import Literal, Optional

import torch

from tasktrain.callbacks.base import Callback
from tasktrain.exceptions import MisconfigurationException


class LearningRateMonitor(Callback):
    def __init__(
        self,
        logging_interval: Optional[Literal["step", "epoch"]] = None,
        log_momentum: bool = False,
        log_weight_decay: bool = False,
    ):
        if logging_interval not in ("step", "epoch", None):
            raise MisconfigurationException(f"LearningRateMonitor(logging_interval={logging_interval!r}): use "
                                            "'step', 'epoch' or None.")
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self.lrs = {}
        self.last_momentum_values = {}
        self.last_weight_decay_values = {}

    def setup(self, trainer, pl_module, stage):
        if stage == "fit" and not trainer.loggers:
            raise MisconfigurationException(
                "Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger (logger=False). Use "
                "logger=True, a TensorBoardLogger or a CSVLogger, or remove it.")

    def on_train_start(self, trainer, *args, **kwargs):
        names = [name for _, entry_names, _ in self._named_optimizers(trainer) for name in entry_names]
        self.lrs = {name: [] for name in names}
        self.last_momentum_values = {f"{name}-momentum": None for name in names}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in names}
        if self.log_momentum:
            lacking = [type(o).__name__ for o in trainer.optimizers
                       if "momentum" not in o.defaults and "betas" not in o.defaults]
            if lacking:
                warnings.warn("You have set log_momentum=True, but some optimizers do not have momentum. This will log "
                              f"a value 0 for the momentum ({', '.join(lacking)} has no momentum or betas).",
                              RuntimeWarning)

    def _named_optimizers(self, trainer):
        """[(optimizer, a name per param group, its scheduler config or None)] in Lightning's order and names."""
        entries, per_class = [], defaultdict(int)

        def add(optimizer, base, config):
            if config is None or config.name is None:  # a named scheduler does not count towards "-1", "-2"
                per_class[type(optimizer)] += 1
            groups = optimizer.param_groups
            group_names = [group.get("name", f"pg{i}") for i, group in enumerate(groups, start=1)]
            duplicates = {n for n in group_names if group_names.count(n) > 1}
            if duplicates:
                raise MisconfigurationException(
                    "A single `Optimizer` cannot have multiple parameter groups with identical `name` values. "
                    f"{base} has duplicated parameter group names {duplicates}")
            count = per_class.get(type(optimizer), 0)
            base = f"{base}-{count - 1}" if count > 1 else base
            if len(groups) > 1:
                names = [f"{base}/{n}" for n in group_names]
            else:
                names = [f"{base}/{groups[0]['name']}" if groups[0].get("name") else base]
            entries.append((optimizer, names, config))

        for config in trainer.lr_scheduler_configs:
            optimizer = config.scheduler.optimizer
            add(optimizer, config.name if config.name is not None else f"lr-{type(optimizer).__name__}", config)
        seen = [entry[0] for entry in entries]
        for optimizer in trainer.optimizers:
            optimizer = getattr(optimizer, "optimizer", optimizer)  # an engine's wrapper: the torch optimizer inside
            if not any(optimizer is other for other in seen):
                add(optimizer, f"lr-{type(optimizer).__name__}", None)
        return entries

    def _extract_stats(self, trainer, interval):
        """The values to write at a point of `interval` ("step", "epoch", or "any"); fills the histories."""
        stats = {}
        for optimizer, names, config in self._named_optimizers(trainer):
            for name in names:  # a group added since: the single group's history continues as "/pg1"
                old = name.replace("/pg1", "")
                if "/pg1" in name and old in self.lrs:
                    self.lrs[name] = self.lrs.pop(old)
                elif name not in self.lrs:
                    self.lrs[name] = []
            if config is not None and interval not in (config.interval, "any"):
                continue
            use_betas = "betas" in optimizer.defaults  # Adam-style optimizers keep their momentum as the first beta
            for group, name in zip(optimizer.param_groups, names):
                stats[name] = group["lr"]
                self.lrs[name].append(group["lr"])
                if self.log_momentum:
                    key = f"{name}-momentum"
                    stats[key] = self.last_momentum_values[key] = (
                        group["betas"][0] if use_betas else group.get("momentum", 0))
                if self.log_weight_decay:
                    key = f"{name}-weight_decay"
                    stats[key] = self.last_weight_decay_values[key] = group.get("weight_decay", 0.0)
        device = trainer.strategy.root_device
        trainer.callback_metrics.update({k: torch.tensor(float(v), device=device) for k, v in stats.items()})
        return stats

    def on_train_batch_start(self, trainer, *args, **kwargs):
        # Lightning's point: before the step, the rate it trains with, when the step about to be taken is a log step
        # (batches_that_stepped + 1 a multiple of log_every_n_steps); each micro-batch of such a window writes, as there
        if not trainer.should_update_logs or self.logging_interval == "epoch":
            return
        stats = self._extract_stats(trainer, "step" if self.logging_interval is None else "any")
        if stats:  # every rank, as Lightning (log_to_loggers)
            trainer.log_to_loggers(stats, trainer.state.batches_that_stepped, save=False)

    def on_train_epoch_start(self, trainer, *args, **kwargs):
        if self.logging_interval == "step":
            return
        stats = self._extract_stats(trainer, "epoch" if self.logging_interval is None else "any")
        if stats:  # every rank, as Lightning (log_to_loggers)
            trainer.log_to_loggers(stats, trainer.state.batches_that_stepped, save=False)
