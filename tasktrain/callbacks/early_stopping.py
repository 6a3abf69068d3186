"""EarlyStopping: stop when a monitored metric stops improving, crosses a threshold, or is not finite.

It checks once per validation run of the fit: at on_train_epoch_end after the epoch-end validation (and after
the module's own on_train_epoch_end, so a metric logged there counts), and, when validation also runs inside the
epoch (val_check_interval), at the on_train_batch_end of that step. `patience` counts these checks. A fit with
no validation loop is checked at every epoch end, on the training metrics. An epoch end without validation
(check_val_every_n_epoch > 1) is not a check: the value would be the old one.
"""
import math
from enum import Enum

from tasktrain.callbacks.base import Callback


class EarlyStoppingReason(Enum):
    """Why EarlyStopping stopped the run (`early_stopping.stopping_reason`); the values are Lightning's."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    def __init__(self, monitor, mode="min", patience=3, min_delta=0.0, stopping_threshold=None,
                 divergence_threshold=None, check_finite=True, verbose=True):
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"EarlyStopping(monitor={monitor!r}): give the name of a logged metric, e.g. 'val_loss'.")
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping(mode={mode!r}): use 'min' or 'max'.")
        if not isinstance(patience, int) or patience < 0:
            raise ValueError(f"EarlyStopping(patience={patience!r}): use a non-negative number of checks.")
        if min_delta < 0:
            raise ValueError(f"EarlyStopping(min_delta={min_delta}): use a non-negative number; mode sets the "
                             "direction.")
        self.monitor = monitor
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
        self.stopped_epoch = None  # the epoch at which it asked the trainer to stop
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
            self._validated = True

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        # Only true right after a validation inside the epoch: the epoch-end one comes after the last batch end.
        if self._validated:
            self._validated = False
            self._check(trainer)

    def on_train_epoch_end(self, trainer, module):
        if self._validated or not trainer.enable_validation:
            self._check(trainer)
        self._validated = False

    # -- the decision ----------------------------------------------------------------------------------------------
    def _check(self, trainer):
        if trainer.should_stop or trainer.fast_dev_run:  # a debugging run is not judged (Lightning's rule)
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            raise KeyError(
                f"EarlyStopping(monitor={self.monitor!r}): no such metric was logged. Logged metrics: "
                f"{sorted(metrics) or 'none'}. Log it with self.log({self.monitor!r}, ...) or change monitor."
            )
        current = float(metrics[self.monitor])  # one host sync per check, not per step
        reason = self._evaluate(current, trainer.current_epoch)
        if reason is None:
            return
        self.reason = reason
        self.stopping_reason = self._reason_kind
        self.stopped_epoch = trainer.current_epoch
        self.stopped_step = trainer.global_step
        trainer.should_stop = True
        if self.verbose and trainer.is_global_zero:
            print(f"[tasktrain] EarlyStopping at epoch {trainer.current_epoch}, step {trainer.global_step}: {reason}",
                  flush=True)

    def _evaluate(self, current, epoch):
        """Update the counters with `current`; return why training should stop, or None."""
        name = self.monitor
        self._reason_kind = EarlyStoppingReason.NON_FINITE_METRIC
        if self.check_finite and not math.isfinite(current):
            return (f"{name} = {current} is not finite. The previous best was {self._fmt(self.best_score)}. "
                    "Set check_finite=False to keep training through it.")
        if self.stopping_threshold is not None and self._beyond(current, self.stopping_threshold):
            relation = "<" if self.mode == "min" else ">"
            self._reason_kind = EarlyStoppingReason.STOPPING_THRESHOLD
            return f"{name} = {current:.6g} reached the stopping_threshold ({relation} {self.stopping_threshold})."
        if self.divergence_threshold is not None and self._beyond(self.divergence_threshold, current):
            relation = ">" if self.mode == "min" else "<"
            self._reason_kind = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            return (f"{name} = {current:.6g} diverged past the divergence_threshold ({relation} "
                    f"{self.divergence_threshold}).")
        if self._improves(current):
            self.best_score = current
            self.best_epoch = epoch
            self.wait_count = 0
            return None
        self.wait_count += 1
        if self.wait_count >= self.patience:
            self._reason_kind = EarlyStoppingReason.PATIENCE_EXHAUSTED
            return (f"{name} did not improve by more than {self.min_delta} over the last {self.wait_count} checks; "
                    f"best {self._fmt(self.best_score)} at epoch {self.best_epoch}, now {current:.6g}.")
        return None

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
        return {"wait_count": self.wait_count, "best_score": self.best_score, "best_epoch": self.best_epoch,
                "stopped_epoch": self.stopped_epoch, "patience": self.patience,
                "stopping_reason": self.stopping_reason.value, "stopping_reason_message": self.reason}

    def load_state_dict(self, state):
        self.wait_count = int(state.get("wait_count", 0))
        self.best_score = state.get("best_score")
        self.best_epoch = state.get("best_epoch")
        self.stopped_epoch = state.get("stopped_epoch")
        self.stopping_reason = EarlyStoppingReason(state.get("stopping_reason", 0))
        self.reason = state.get("stopping_reason_message", self.reason)

    @property
    def stopping_reason_message(self):
        """Lightning's name for `reason`: why it stopped, in words (None while it has not)."""
        return self.reason
