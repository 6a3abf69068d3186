"""ProgressBar: Lightning's base class for progress bars. It draws nothing; it knows the totals of each loop
(`total_train_batches`, `total_val_batches`, ...), the descriptions, which evaluation loader is current, and what
a bar shows (`get_metrics`). A custom bar subclasses it and implements `enable()` / `disable()` and the hooks it
draws in; on ranks other than 0 `setup` disables it."""
import warnings

from tasktrain.callbacks.base import Callback


class ProgressBar(Callback):
    def __init__(self):
        self._trainer = None
        self._current_eval_dataloader_idx = None

    @property
    def trainer(self):
        if self._trainer is None:
            raise TypeError(f"The `{type(self).__name__}._trainer` reference has not been set yet.")
        return self._trainer

    @property
    def sanity_check_description(self):
        return "Sanity Checking"

    @property
    def train_description(self):
        return "Training"

    @property
    def validation_description(self):
        return "Validation"

    @property
    def test_description(self):
        return "Testing"

    @property
    def predict_description(self):
        return "Predicting"

    @property
    def total_train_batches(self):
        """Training batches of this epoch (inf: the loader has no length); with max_epochs=-1 and max_steps, no more
        than the steps left."""
        trainer = self.trainer
        batches = _inf(trainer.num_training_batches)
        if trainer.max_epochs == -1 and trainer.max_steps is not None and trainer.max_steps > 0:
            return min(batches, trainer.max_steps - trainer.global_step)
        return batches

    @property
    def total_val_batches_current_dataloader(self):
        trainer = self.trainer
        batches = trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
        return _inf(batches[self._current_eval_dataloader_idx] if isinstance(batches, list) else batches)

    @property
    def total_test_batches_current_dataloader(self):
        batches = self.trainer.num_test_batches
        return _inf(batches[self._current_eval_dataloader_idx] if isinstance(batches, list) else batches)

    @property
    def total_predict_batches_current_dataloader(self):
        return _inf(self.trainer.num_predict_batches[self._current_eval_dataloader_idx])

    @property
    def total_val_batches(self):
        """Validation batches of all the loaders of this epoch's validation; 0 when this epoch does not validate."""
        from tasktrain.trainer.loop import val_at_epoch_end

        trainer = self.trainer
        if not val_at_epoch_end(trainer, trainer.current_epoch) or trainer.limit_val_batches == 0:
            return 0
        batches = trainer.num_val_batches
        return sum(_inf(one) for one in batches) if isinstance(batches, list) else _inf(batches)

    def has_dataloader_changed(self, dataloader_idx):
        old, self._current_eval_dataloader_idx = self._current_eval_dataloader_idx, dataloader_idx
        return old != dataloader_idx

    def reset_dataloader_idx_tracker(self):
        self._current_eval_dataloader_idx = None

    def disable(self):
        """A subclass says how it stops drawing (called on ranks other than 0)."""
        raise NotImplementedError

    def enable(self):
        """A subclass says how it draws again."""
        raise NotImplementedError

    def print(self, *args, **kwargs):
        """Print without breaking the bar (a subclass that draws overrides it)."""
        print(*args, **kwargs)

    def setup(self, trainer, pl_module, stage):
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()

    def get_metrics(self, trainer, pl_module):
        """What the bar shows: the logger's version as "v_num" (its last 4 characters when a string), then the values
        logged with prog_bar=True (one host sync each). Override it to change what is displayed."""
        standard = get_standard_metrics(trainer)
        shown = trainer.progress_bar_metrics
        duplicates = list(standard.keys() & shown.keys())
        if duplicates and trainer.is_global_zero:
            warnings.warn(
                f"The progress bar already tracks a metric with the name(s) '{', '.join(duplicates)}' and"
                f" `self.log('{duplicates[0]}', ..., prog_bar=True)` will overwrite this value. "
                " If this is undesired, change the name or override `get_metrics()` in the progress bar callback.")
        return {**standard, **shown}


def get_standard_metrics(trainer):
    """{"v_num": the loggers' version} when there is a logger with one (a string: its last 4 characters)."""
    loggers = trainer.loggers
    if not loggers:
        return {}
    version = loggers[0].version if len(loggers) == 1 else "_".join(dict.fromkeys(str(lg.version) for lg in loggers))
    if version in ("", None):
        return {}
    return {"v_num": version[-4:] if isinstance(version, str) else version}


class SwitchedProgressBar(ProgressBar):
    """What the drawing bars (TQDMProgressBar, RichProgressBar) share: `refresh_rate` (0: nothing is drawn) and the
    switch that setup turns off on ranks other than 0. A subclass sets `_refresh_rate` and `_enabled`."""

    @property
    def refresh_rate(self):
        return self._refresh_rate

    @property
    def is_enabled(self):
        return self._enabled and self.refresh_rate > 0

    @property
    def is_disabled(self):
        return not self.is_enabled

    def disable(self):
        self._enabled = False

    def enable(self):
        self._enabled = True


def _inf(batches):
    return float("inf") if batches is None else batches
