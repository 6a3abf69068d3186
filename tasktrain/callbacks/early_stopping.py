"""EarlyStopping: stop when a monitored metric stops improving, crosses a threshold, or is not finite.

Lightning 2.6's callback, method by method, so that a subclass overriding one of its steps (or a test patching it)
works as under Lightning:

    on_train_epoch_end / on_validation_end -> _should_skip_check -> _run_early_stopping_check
        -> _validate_condition_metric(logs) -> _evaluate_stopping_criteria(current) -> (should_stop, reason)
        -> strategy.reduce_boolean_decision(should_stop, all=False) -> _log_info(trainer, reason, ...)

check_on_train_epoch_end: True checks at every training epoch end (after that epoch's validation); False at the end
of every validation run of the fit (not the sanity check). None (default) is resolved in `setup` as Lightning does:
True when validation runs once per epoch at its end (val_check_interval 1.0, check_val_every_n_epoch 1), else False.
A fit without a validation loop is therefore checked at every epoch end, on the training metrics. `patience` counts
checks. Messages (verbose=True) go to the module's `log` at INFO level, rank-prefixed in a multi-process run.
"""
import logging
import warnings
from enum import Enum
from typing import Optional

import torch

from tasktrain.callbacks.base import Callback
from tasktrain.exceptions import MisconfigurationException

log = logging.getLogger(__name__)


class EarlyStoppingReason(Enum):
    """Why EarlyStopping stopped the run (`early_stopping.stopping_reason`); the values are Lightning's."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


def _rank_prefixed_message(message, rank):
    return message if rank is None else f"[rank: {rank}] {message}"


class EarlyStopping(Callback):
    mode_dict = {"min": torch.lt, "max": torch.gt}
    order_dict = {"min": "<", "max": ">"}

    # Lightning 2.6's arguments in its positional order
    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: Optional[float] = None,
        divergence_threshold: Optional[float] = None,
        check_on_train_epoch_end: Optional[bool] = None,
        log_rank_zero_only: bool = False,
    ):
        super().__init__()
        if not isinstance(monitor, str) or not monitor:
            raise MisconfigurationException(
                f"EarlyStopping(monitor={monitor!r}): give the name of a logged metric, e.g. 'val_loss'.")
        if mode not in self.mode_dict:
            raise MisconfigurationException(f"`mode` can be {', '.join(self.mode_dict)}, got {mode}")
        if not isinstance(patience, int) or patience < 0:
            raise MisconfigurationException(
                f"EarlyStopping(patience={patience!r}): use a non-negative number of checks.")
        if check_on_train_epoch_end not in (None, True, False):
            raise MisconfigurationException(f"EarlyStopping(check_on_train_epoch_end={check_on_train_epoch_end!r}): "
                                            "use None, True or False.")
        self.monitor = monitor
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.strict = strict  # False: a check without the metric is skipped (with verbose, a RuntimeWarning)
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.log_rank_zero_only = log_rank_zero_only  # False: every rank logs its messages, rank-prefixed
        self._check_on_train_epoch_end = check_on_train_epoch_end  # None until setup resolves it
        # Lightning's sign convention: stored with the mode's direction (negative in "min" mode), so that
        # `current - min_delta` beats best_score exactly when it improves by more than |min_delta|
        self.min_delta = min_delta * (1 if self.monitor_op == torch.gt else -1)
        self.best_score = torch.tensor(torch.inf) if self.monitor_op == torch.lt else -torch.tensor(torch.inf)
        self.wait_count = 0
        self.stopped_epoch = 0  # the epoch at which it asked the trainer to stop (0 while it has not: Lightning's)
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message = None  # why it stopped, in words
        self.best_epoch = None  # tasktrain's: the epoch of best_score (not saved: Lightning's state has no such key)
        self.stopped_step = None  # tasktrain's: the global step at which it asked the trainer to stop

    @property
    def monitor_op(self):
        return self.mode_dict[self.mode]

    @property
    def check_on_train_epoch_end(self):
        """The argument as given (None) before setup, as resolved after it."""
        return self._check_on_train_epoch_end

    @property
    def reason(self):
        """tasktrain's earlier name for `stopping_reason_message`."""
        return self.stopping_reason_message

    @property
    def state_key(self):
        # Lightning's key order (monitor, then mode): checkpoints of either framework name the same state
        return f"{type(self).__qualname__}{repr({'monitor': self.monitor, 'mode': self.mode})}"

    @property
    def _legacy_state_keys(self):
        """The keys tasktrain saved this state under before (sorted settings): such checkpoints still load it."""
        return [self._generate_state_key(monitor=self.monitor, mode=self.mode)]

    # -- events --------------------------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage):
        if self._check_on_train_epoch_end is None:
            # validation more than once an epoch, or not every epoch: check after each validation run instead.
            # Lightning's test, on trainer.val_check_interval as it reads now (a value written after Trainer(...)
            # too). A time val_check_interval reads as given here, never 1.0: checked after each validation run
            # (Lightning's own Trainer has no val_check_interval attribute then, and its EarlyStopping fails:
            # docs/lightning.md, "val_check_interval as a time").
            self._check_on_train_epoch_end = (trainer.val_check_interval == 1.0
                                              and trainer.check_val_every_n_epoch == 1)

    def _should_skip_check(self, trainer):
        return trainer.state.fn != "fit" or trainer.sanity_checking

    def on_train_epoch_end(self, trainer, pl_module):
        if not self._check_on_train_epoch_end or self._should_skip_check(trainer):
            return
        self._run_early_stopping_check(trainer)

    def on_validation_end(self, trainer, pl_module):
        if self._check_on_train_epoch_end or self._should_skip_check(trainer):
            return
        self._run_early_stopping_check(trainer)

    # -- the decision ----------------------------------------------------------------------------------------------
    def _validate_condition_metric(self, logs):
        if logs.get(self.monitor) is not None:
            return True
        message = (f"Early stopping conditioned on metric `{self.monitor}` which is not available. Pass in or modify "
                   f"your `EarlyStopping` callback to use any of the following: `{'`, `'.join(logs)}`")
        if self.strict:
            raise RuntimeError(message)
        if self.verbose:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        return False

    def _run_early_stopping_check(self, trainer):
        """Evaluate the monitored metric; if any rank decides to stop, every rank tells its trainer to stop."""
        logs = trainer.callback_metrics
        # a debugging run is not judged (Lightning's rule); nor a check without the metric (strict=False)
        if trainer.fast_dev_run or not self._validate_condition_metric(logs):
            return
        current = logs[self.monitor]
        current = (current if isinstance(current, torch.Tensor) else torch.tensor(float(current))).squeeze()
        should_stop, reason = self._evaluate_stopping_criteria(current)
        if self.best_score is current:  # it improved
            self.best_epoch = trainer.current_epoch
        should_stop = trainer.strategy.reduce_boolean_decision(should_stop, all=False)
        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop:
            self.stopped_epoch = trainer.current_epoch
            self.stopped_step = trainer.global_step
            self.stopping_reason_message = reason
        if reason and self.verbose:
            self._log_info(trainer, reason, self.log_rank_zero_only)

    def _evaluate_stopping_criteria(self, current):
        """Update the counters with `current` (a tensor); return (should_stop, Lightning's message or None)."""
        order = self.order_dict[self.mode]
        if self.check_finite and not torch.isfinite(current):
            self.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
            return True, (f"Monitored metric {self.monitor} = {current} is not finite. Previous best value was "
                          f"{self.best_score:.3f}. Signaling Trainer to stop.")
        if self.stopping_threshold is not None and self.monitor_op(current, self.stopping_threshold):
            self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
            return True, (f"Stopping threshold reached: {self.monitor} = {current} {order} "
                          f"{self.stopping_threshold}. Signaling Trainer to stop.")
        if self.divergence_threshold is not None and self.monitor_op(-current, -self.divergence_threshold):
            self.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            return True, (f"Divergence threshold reached: {self.monitor} = {current} {order} "
                          f"{self.divergence_threshold}. Signaling Trainer to stop.")
        if self.monitor_op(current - self.min_delta, self.best_score.to(current.device)):
            reason = self._improvement_message(current)
            self.best_score = current
            self.wait_count = 0
            return False, reason
        self.wait_count += 1
        if self.wait_count >= self.patience:
            self.stopping_reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
            return True, (f"Monitored metric {self.monitor} did not improve in the last {self.wait_count} records. "
                          f"Best score: {self.best_score:.3f}. Signaling Trainer to stop.")
        return False, None

    def _improvement_message(self, current):
        """The message for an improvement of the monitored score (Lightning's words)."""
        if torch.isfinite(self.best_score):
            return (f"Metric {self.monitor} improved by {abs(self.best_score - current):.3f} >= min_delta = "
                    f"{abs(self.min_delta)}. New best score: {current:.3f}")
        return f"Metric {self.monitor} improved. New best score: {current:.3f}"

    @staticmethod
    def _log_info(trainer, message, log_rank_zero_only):
        rank = trainer.global_rank if trainer.world_size > 1 else None
        message = _rank_prefixed_message(message, rank)
        if rank is None or not log_rank_zero_only or rank == 0:
            log.info(message)

    # -- state -----------------------------------------------------------------------------------------------------
    def state_dict(self):
        # Lightning's keys in its order
        return {"wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch, "best_score": self.best_score,
                "patience": self.patience, "stopping_reason": self.stopping_reason.value,
                "stopping_reason_message": self.stopping_reason_message}

    def load_state_dict(self, state_dict):
        self.wait_count = state_dict["wait_count"]
        self.stopped_epoch = state_dict["stopped_epoch"] or 0
        best = state_dict["best_score"]
        if best is None:  # tasktrain's earlier checkpoints: no improvement seen yet
            best = torch.tensor(torch.inf) if self.monitor_op == torch.lt else -torch.tensor(torch.inf)
        self.best_score = best if isinstance(best, torch.Tensor) else torch.tensor(float(best))
        self.patience = state_dict.get("patience", self.patience)
        self.stopping_reason = EarlyStoppingReason(state_dict.get("stopping_reason",
                                                                  EarlyStoppingReason.NOT_STOPPED.value))
        self.stopping_reason_message = state_dict.get("stopping_reason_message")
