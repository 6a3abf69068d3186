"""LearningRateMonitor: write each optimizer's learning rate to the trainer's loggers.

Names: "lr-<Optimizer class>" ("lr-AdamW"), "-1", "-2" added for further optimizers of the same class,
"/pg1", "/pg2", ... for each param group when there are several, or the scheduler's "name" when
configure_optimizers gave one.

logging_interval="step": as in Lightning, at on_train_batch_start of the batches that are log steps (the batch about
to be counted, trainer.state.batches_that_stepped + 1, a multiple of log_every_n_steps), the rate that step trains
with, written at batches_that_stepped (Lightning's logging step), without an "epoch" value.
logging_interval="epoch": at each epoch start, the rate that epoch trains with.
logging_interval=None: each optimizer at its scheduler's interval; optimizers without a scheduler at steps.

log_momentum=True adds "<name>-momentum" (the group's `momentum`, or `betas[0]` for Adam-style optimizers; 0 with
a warning for an optimizer that has neither); log_weight_decay=True adds "<name>-weight_decay". They are written
with the rate, at the same points.

As in Lightning, `lrs` keeps the history ({name: [each rate written]}), `last_momentum_values` and
`last_weight_decay_values` the latest "<name>-momentum" / "<name>-weight_decay" values (None until written).
"""
import warnings

from tasktrain.callbacks.base import Callback
from tasktrain.exceptions import MisconfigurationException


class LearningRateMonitor(Callback):
    def __init__(self, logging_interval=None, log_momentum=False, log_weight_decay=False):
        if logging_interval not in ("step", "epoch", None):
            raise MisconfigurationException(f"LearningRateMonitor(logging_interval={logging_interval!r}): use "
                                            "'step', 'epoch' or None.")
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self._entries = []  # (interval, optimizer, [(name, param group index)])
        self._last_step = -1
        self.lrs = {}
        self.last_momentum_values = {}
        self.last_weight_decay_values = {}

    def setup(self, trainer, module, stage):
        if stage == "fit" and not trainer.loggers:
            raise MisconfigurationException(
                "Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger (logger=False). Use "
                "logger=True, a TensorBoardLogger or a CSVLogger, or remove it.")

    def on_train_start(self, trainer, module):
        intervals = {id(c.scheduler.optimizer): c for c in trainer.lr_scheduler_configs
                     if hasattr(c.scheduler, "optimizer")}
        seen = {}
        self._entries = []
        for optimizer in trainer.optimizers:
            config = intervals.get(id(optimizer))
            if self.logging_interval is not None:
                interval = self.logging_interval
            else:
                interval = config.interval if config is not None else "step"
            base = config.name if config is not None and config.name else f"lr-{type(optimizer).__name__}"
            count = seen.get(base, 0)
            seen[base] = count + 1
            name = base if count == 0 else f"{base}-{count}"
            groups = optimizer.param_groups
            names = [(name, 0)] if len(groups) == 1 else [(f"{name}/pg{i + 1}", i) for i in range(len(groups))]
            self._entries.append((interval, optimizer, names))
        self._last_step = trainer.global_step  # no optimizer step yet (or, on resume, already written)
        names = [name for _, _, entry_names in self._entries for name, _ in entry_names]
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

    def _values(self, interval):
        values = {}
        for entry_interval, optimizer, names in self._entries:
            if entry_interval != interval:
                continue
            for name, i in names:
                group = optimizer.param_groups[i]
                values[name] = float(group["lr"])
                self.lrs.setdefault(name, []).append(values[name])
                if self.log_momentum:
                    # Adam-style optimizers keep their momentum as the first beta
                    key = f"{name}-momentum"
                    values[key] = self.last_momentum_values[key] = float(
                        group["betas"][0] if "betas" in optimizer.defaults else group.get("momentum", 0.0))
                if self.log_weight_decay:
                    key = f"{name}-weight_decay"
                    values[key] = self.last_weight_decay_values[key] = float(group.get("weight_decay", 0.0))
        return values

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        # Lightning's point: before the step, the rate it trains with, when the step about to be taken is a log step
        # (batches_that_stepped + 1 a multiple of log_every_n_steps); each micro-batch of such a window writes, as there
        if not trainer.should_update_logs or not trainer.is_global_zero:
            return
        values = self._values("step")
        if values:
            trainer.log_to_loggers(values, trainer.state.batches_that_stepped)

    def on_train_epoch_start(self, trainer, module):
        if trainer.is_global_zero:
            values = self._values("epoch")
            if values:
                trainer.log_to_loggers(values, trainer.state.batches_that_stepped)
