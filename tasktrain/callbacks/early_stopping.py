"""EarlyStopping: stop when a monitored metric stops improving, crosses a threshold, or is not finite.

check_on_train_epoch_end (Lightning's argument): True checks at every training epoch end (after that epoch's
validation, if it has one); False checks at the end of every validation run of the fit (inside the epoch too; not
the sanity check). None (default) checks once per validation run of the fit: at on_train_epoch_end after the
epoch-end validation (and after the module's own on_train_epoch_end, so a metric logged there counts), and, when
validation also runs inside the epoch (val_check_interval), at the on_train_batch_end of that step. `patience`
counts these checks. A fit with no validation loop is checked at every epoch end, on the training metrics. An epoch
end without validation (check_val_every_n_epoch > 1) is not a check: the value would be the old one.
"""
import math
import warnings
from enum import Enum

import torch

from tasktrain.callbacks.base import Callback
from tasktrain.exceptions import MisconfigurationException


class EarlyStoppingReason(Enum):
    """Why EarlyStopping stopped the run (`early_stopping.stopping_reason`); the values are Lightning's."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class _MissingMetric(RuntimeError, KeyError):
    """Lightning raises RuntimeError for a missing monitored metric; a KeyError too, as tasktrain's was."""

    def __str__(self):  # KeyError's would quote the message
        return RuntimeError.__str__(self)


class EarlyStopping(Callback):
    # Lightning 2.6's arguments in its positional order
    def __init__(self, monitor, min_delta=0.0, patience=3, verbose=False, mode="min", strict=True, check_finite=True,
                 stopping_threshold=None, divergence_threshold=None, check_on_train_epoch_end=None,
                 log_rank_zero_only=False):
        if not isinstance(monitor, str) or not monitor:
            raise MisconfigurationException(
                f"EarlyStopping(monitor={monitor!r}): give the name of a logged metric, e.g. 'val_loss'.")
        if mode not in ("min", "max"):
            raise MisconfigurationException(f"EarlyStopping(mode={mode!r}): use 'min' or 'max'.")
        if not isinstance(patience, int) or patience < 0:
            raise MisconfigurationException(
                f"EarlyStopping(patience={patience!r}): use a non-negative number of checks.")
        if min_delta < 0:
            raise MisconfigurationException(
                f"EarlyStopping(min_delta={min_delta}): use a non-negative number; mode sets the "
                "direction.")
        if check_on_train_epoch_end not in (None, True, False):
            raise MisconfigurationException(f"EarlyStopping(check_on_train_epoch_end={check_on_train_epoch_end!r}): "
                                            "use None, True or False.")
        self.monitor = monitor
        self.strict = strict  # False: a check without the metric is skipped (with verbose, a RuntimeWarning)
        self.log_rank_zero_only = log_rank_zero_only  # False: every rank prints its messages, rank-prefixed
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self.mode = mode
        self.patience = patience
        self.min_delta = float(min_delta)
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.check_finite = check_finite
        self.verbose = verbose
        self.wait_count = 0
        self.best_score = None  # float
        self.best_epoch = None
        self.stopped_epoch = 0  # the epoch at which it asked the trainer to stop (0 while it has not: Lightning's)
        self.stopped_step = None
        self.reason = None  # why it stopped, in words
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED  # the same, as an enum
        self._validated = False

    @property
    def state_key(self):
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)

    # -- events --------------------------------------------------------------------------------------------------
    def setup(self, trainer, module, stage):
        self._validated = False

    def on_validation_end(self, trainer, module):
        if trainer.state.fn == "fit" and trainer.state.stage in ("train", "validate"):  # (not the sanity check)
            # Lightning's default (None): at the epoch's end when validation runs once an epoch, else at each
            # validation's end (the one inside the epoch runs after on_train_batch_end, as Lightning's)
            at_epoch_end = self.check_on_train_epoch_end
            if at_epoch_end is None:
                at_epoch_end = trainer.val_check_interval in (None, 1.0) and trainer.check_val_every_n_epoch == 1
            if not at_epoch_end:
                self._check(trainer)
            else:
                self._validated = True

    def on_train_epoch_end(self, trainer, module):
        if self.check_on_train_epoch_end or (self.check_on_train_epoch_end is None
                                             and (self._validated or not trainer.enable_validation)):
            self._check(trainer)
        self._validated = False

    # -- the decision ----------------------------------------------------------------------------------------------
    def _check(self, trainer):
        if trainer.should_stop or trainer.fast_dev_run:  # a debugging run is not judged (Lightning's rule)
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            message = (f"EarlyStopping(monitor={self.monitor!r}): no such metric was logged. Logged metrics: "
                       f"{sorted(metrics) or 'none'}. Log it with self.log({self.monitor!r}, ...) or change monitor"
                       " (or strict=False to skip such checks).")
            if self.strict:
                raise _MissingMetric(message)
            if self.verbose:
                warnings.warn(message, RuntimeWarning, stacklevel=2)
            return
        value = metrics[self.monitor]
        # the messages show the value as Lightning does (a tensor); the decision uses one host sync per check
        shown = value.detach().squeeze().cpu() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        stop, message = self._evaluate(float(shown), shown, trainer.current_epoch)
        if stop:
            self.reason = message
            self.stopping_reason = self._reason_kind
            self.stopped_epoch = trainer.current_epoch
            self.stopped_step = trainer.global_step
            trainer.should_stop = True
        if message and self.verbose and (trainer.is_global_zero or not self.log_rank_zero_only):
            rank = f"[rank: {trainer.global_rank}] " if trainer.world_size > 1 else ""
            print(f"{rank}{message}", flush=True)

    def _evaluate(self, current, shown, epoch):
        """Update the counters with `current`; return (stop, Lightning's message for it, or None)."""
        name = self.monitor
        best = self.best_score if self.best_score is not None else (math.inf if self.mode == "min" else -math.inf)
        relation = "<" if self.mode == "min" else ">"
        if self.check_finite and not math.isfinite(current):
            self._reason_kind = EarlyStoppingReason.NON_FINITE_METRIC
            return True, (f"Monitored metric {name} = {shown} is not finite. Previous best value was {best:.3f}. "
                          "Signaling Trainer to stop.")
        if self.stopping_threshold is not None and self._beyond(current, self.stopping_threshold):
            self._reason_kind = EarlyStoppingReason.STOPPING_THRESHOLD
            return True, (f"Stopping threshold reached: {name} = {shown} {relation} {self.stopping_threshold}. "
                          "Signaling Trainer to stop.")
        if self.divergence_threshold is not None and self._beyond(self.divergence_threshold, current):
            self._reason_kind = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            return True, (f"Divergence threshold reached: {name} = {shown} {relation} {self.divergence_threshold}. "
                          "Signaling Trainer to stop.")
        if self._improves(current):
            if math.isfinite(best):
                message = (f"Metric {name} improved by {abs(best - current):.3f} >= min_delta = {self.min_delta}. "
                           f"New best score: {current:.3f}")
            else:
                message = f"Metric {name} improved. New best score: {current:.3f}"
            self.best_score = current
            self.best_epoch = epoch
            self.wait_count = 0
            return False, message
        self.wait_count += 1
        if self.wait_count >= self.patience:
            self._reason_kind = EarlyStoppingReason.PATIENCE_EXHAUSTED
            return True, (f"Monitored metric {name} did not improve in the last {self.wait_count} records. "
                          f"Best score: {best:.3f}. Signaling Trainer to stop.")
        return False, None

    def _improves(self, current):
        if math.isnan(current):
            return False
        if self.best_score is None:
            return True
        if self.mode == "min":
            return current < self.best_score - self.min_delta
        return current > self.best_score + self.min_delta

    def _beyond(self, a, b):
        """a is strictly better than b in this mode."""
        return a < b if self.mode == "min" else a > b

    @staticmethod
    def _fmt(value):
        return "none" if value is None else f"{value:.6g}"

    # -- state -----------------------------------------------------------------------------------------------------
    def state_dict(self):
        # Lightning's keys in its order, and no others (best_epoch, tasktrain's attribute, is not restored by a resume)
        return {"wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch, "best_score": self.best_score,
                "patience": self.patience, "stopping_reason": self.stopping_reason.value,
                "stopping_reason_message": self.reason}

    def load_state_dict(self, state):
        self.wait_count = int(state.get("wait_count", 0))
        self.best_score = state.get("best_score")
        self.best_epoch = state.get("best_epoch")  # (a checkpoint of an earlier tasktrain has it)
        self.stopped_epoch = state.get("stopped_epoch") or 0
        self.stopping_reason = EarlyStoppingReason(state.get("stopping_reason", 0))
        self.reason = state.get("stopping_reason_message", self.reason)

    @property
    def stopping_reason_message(self):
        """Lightning's name for `reason`: why it stopped, in words (None while it has not)."""
        return self.reason
