"""RichProgressBar, Lightning's bar drawn with rich (the Trainer's default when rich is installed), and
RichProgressBarTheme, its styles. On rank 0: a training bar per epoch ("Epoch N/M", the bar, batches done / total,
elapsed • remaining, it/s, and the metrics of `get_metrics` as "name: value"), a validation bar during validation,
a bar per sanity check, test and predict loader; all on rich's console (Lightning's: `console_kwargs` reconfigures
rich's global console, so that rich's logging handler and prints share it).

rich is imported when a bar starts drawing (rich_columns.py holds everything that subclasses rich), so that this
module, and `import tasktrain`, do not import it; without rich, constructing a RichProgressBar is Lightning's
ModuleNotFoundError.

`refresh_rate` is Lightning's: redraws per second at most (0: nothing is drawn). Lightning redraws from a thread
of its own; here the training loop redraws when 1/refresh_rate seconds have passed since the last redraw (and
always at a loop's last batch and an epoch's end), and reads the displayed metrics (a host sync each) only for such
a redraw: what is drawn is the same, and a step is never slowed by reads nobody sees. There is therefore no
`refresh_interval` here (TQDMProgressBar's, whose refresh_rate counts batches): the clock is refresh_rate itself."""
import math
import time
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from tasktrain.callbacks.progress.progress_bar import SwitchedProgressBar


@dataclass
class RichProgressBarTheme:
    """Styles (a rich style string or `rich.style.Style`) of the bar's parts: `description` ("Epoch x", ...),
    `progress_bar` (the bar in progress), `progress_bar_finished`, `progress_bar_pulse` (a loader without a length),
    `batch_progress` ("10/50"), `time`, `processing_speed`, `metrics`; `metrics_text_delimiter` between two metrics
    and `metrics_format` for their values."""
    description: Union[str, Any] = ""
    progress_bar: Union[str, Any] = "#6206E0"
    progress_bar_finished: Union[str, Any] = "#6206E0"
    progress_bar_pulse: Union[str, Any] = "#6206E0"
    batch_progress: Union[str, Any] = ""
    time: Union[str, Any] = "dim"
    processing_speed: Union[str, Any] = "dim underline"
    metrics: Union[str, Any] = "italic"
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"


class RichProgressBar(SwitchedProgressBar):
    """`refresh_rate`: redraws per second at most (0: nothing is drawn); `leave`: keep each epoch's finished training
    bar on screen; `theme`: a RichProgressBarTheme; `console_kwargs`: the arguments of rich's `Console` (`file`,
    `width`, `force_terminal`, ...)."""

    def __init__(self, refresh_rate: int = 100, leave: bool = False,
                 theme: RichProgressBarTheme = RichProgressBarTheme(),
                 console_kwargs: Optional[dict[str, Any]] = None) -> None:
        from tasktrain.callbacks import progress

        if not progress.rich_available():
            raise ModuleNotFoundError(
                "`RichProgressBar` requires `rich` >= 10.2.2. Install it by running `pip install -U rich`.")
        super().__init__()
        self._refresh_rate = refresh_rate
        self._leave = leave
        self._console = None
        self._console_kwargs = console_kwargs or {}
        self._enabled = True
        self.progress = None
        self._reset_progress_bar_ids()
        self._metric_component = None
        self._progress_stopped = False
        self._drawn_at = -math.inf
        self.theme = theme

    # -- the bars: rich Tasks of `progress` -----------------------------------------------------------------------
    def _task(self, which):
        task_id = getattr(self, f"{which}_id")
        if self.progress is None or task_id is None:  # Lightning's assertion, with words
            raise AssertionError(f"`{type(self).__name__}.{which}` is not drawn (yet): it exists while its loop runs "
                                 "on an enabled bar.")
        return self.progress.tasks[task_id]

    @property
    def train_progress_bar(self):
        return self._task("train_progress_bar")

    @property
    def val_sanity_check_bar(self):
        return self._task("val_sanity_progress_bar")

    @property
    def val_progress_bar(self):
        return self._task("val_progress_bar")

    @property
    def test_progress_bar(self):
        return self._task("test_progress_bar")

    @property
    def predict_progress_bar(self):
        return self._task("predict_progress_bar")

    def configure_columns(self, trainer):
        """The columns before the metrics (override to change them): description, bar, batches, time, speed."""
        from rich.progress import TextColumn

        from tasktrain.callbacks.progress import rich_columns as columns

        theme = self.theme
        return [TextColumn("[progress.description]{task.description}"),
                columns.CustomBarColumn(complete_style=theme.progress_bar, finished_style=theme.progress_bar_finished,
                                        pulse_style=theme.progress_bar_pulse),
                columns.BatchesProcessedColumn(style=theme.batch_progress),
                columns.CustomTimeColumn(style=theme.time),
                columns.ProcessingSpeedColumn(style=theme.processing_speed)]

    def _init_progress(self, trainer):
        if not self.is_enabled or (self.progress is not None and not self._progress_stopped):
            return
        from rich import get_console, reconfigure

        from tasktrain.callbacks.progress import rich_columns as columns

        self._reset_progress_bar_ids()
        reconfigure(**self._console_kwargs)
        self._console = get_console()
        if getattr(self._console, "_live_stack", None):  # a display left live by an interrupted run
            self._console.clear_live()
        theme = self.theme
        self._metric_component = columns.MetricsTextColumn(trainer, theme.metrics, theme.metrics_text_delimiter,
                                                           theme.metrics_format, bar=self)
        self.progress = columns.CustomProgress(*self.configure_columns(trainer), self._metric_component,
                                               auto_refresh=False, disable=self.is_disabled, console=self._console)
        self.progress.start()
        self._progress_stopped = False
        self._drawn_at = -math.inf

    def _due(self):
        # (perf_counter: the display keeps its own clock; time.monotonic is the one the time-based val_check_interval
        # and the Timer read, and a test that fakes it counts only their reads, as under Lightning)
        return time.perf_counter() - self._drawn_at >= 1 / self.refresh_rate

    def refresh(self, hard: bool = False) -> None:
        """Redraw now if `hard`, else if 1/refresh_rate seconds have passed since the last redraw."""
        if self.progress is not None and self.is_enabled and (hard or self._due()):
            self.progress.refresh()
            self._drawn_at = time.perf_counter()

    def _add_task(self, total_batches, description, visible=True):
        description = f"[{self.theme.description}]{description}" if self.theme.description else description
        return self.progress.add_task(description, total=total_batches, visible=visible)

    def _update(self, progress_bar_id, current, visible=True, hard=False):
        if self.progress is not None and self.is_enabled and progress_bar_id is not None:
            self.progress.update(progress_bar_id, completed=current, visible=visible)
            self.refresh(hard=hard or current == self.progress.tasks[progress_bar_id].total)

    def _stop_progress(self):
        if self.progress is not None:
            self.progress.stop()
            self._progress_stopped = True  # the next stage starts a new display

    def _reset_progress_bar_ids(self):
        self.train_progress_bar_id = self.val_sanity_progress_bar_id = self.val_progress_bar_id = None
        self.test_progress_bar_id = self.predict_progress_bar_id = None

    def _get_train_description(self, current_epoch):
        description = f"Epoch {current_epoch}"
        if self.trainer.max_epochs is not None:
            description += f"/{self.trainer.max_epochs - 1}"
        # padded to the validation bar's description, so that the columns do not shift between the two
        return f"{description:{len(self.validation_description)}}"

    # -- the stages -----------------------------------------------------------------------------------------------
    def on_sanity_check_start(self, trainer, pl_module):
        self._init_progress(trainer)

    def on_sanity_check_end(self, trainer, pl_module):
        if self.progress is not None and self.val_sanity_progress_bar_id is not None:
            self.progress.update(self.val_sanity_progress_bar_id, advance=0, visible=False)
        self.refresh(hard=True)

    def on_train_start(self, trainer, pl_module):
        self._init_progress(trainer)

    def on_validation_start(self, trainer, pl_module):
        self._init_progress(trainer)

    def on_test_start(self, trainer, pl_module):
        self._init_progress(trainer)

    def on_predict_start(self, trainer, pl_module):
        self._init_progress(trainer)

    def on_train_epoch_start(self, trainer, pl_module):
        if self.is_disabled:
            return
        total, description = self.total_train_batches, self._get_train_description(trainer.current_epoch)
        if self.train_progress_bar_id is not None and self._leave:  # the finished epoch's bar stays printed
            self._stop_progress()
            self._init_progress(trainer)
        if self.progress is not None:
            if self.train_progress_bar_id is None:
                self.train_progress_bar_id = self._add_task(total, description)
            else:
                self.progress.reset(self.train_progress_bar_id, total=total, description=description, visible=True)
        self.refresh(hard=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.is_disabled or self.progress is None:
            return
        if self.train_progress_bar_id is None:  # resumed in the middle of an epoch
            self.train_progress_bar_id = self._add_task(self.total_train_batches,
                                                        self._get_train_description(trainer.current_epoch))
        n = batch_idx + 1
        self.progress.update(self.train_progress_bar_id, completed=n)
        if n == self.train_progress_bar.total or self._due():
            self._update_metrics(trainer, pl_module)
            self.refresh(hard=True)

    def on_train_epoch_end(self, trainer, pl_module):
        self._update_metrics(trainer, pl_module)
        self.refresh(hard=True)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        which = "val_sanity_progress_bar_id" if trainer.sanity_checking else "val_progress_bar_id"
        if getattr(self, which) is not None:  # the previous loader's bar goes
            self.progress.update(getattr(self, which), advance=0, visible=False)
        description = self.sanity_check_description if trainer.sanity_checking else self.validation_description
        setattr(self, which, self._add_task(self.total_val_batches_current_dataloader, description, visible=False))
        self.refresh(hard=True)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.is_disabled:
            return
        self._update(self.val_sanity_progress_bar_id if trainer.sanity_checking else self.val_progress_bar_id,
                     batch_idx + 1)

    def on_validation_epoch_end(self, trainer, pl_module):
        if self.is_enabled and self.val_progress_bar_id is not None and trainer.state.fn == "fit":
            self.progress.update(self.val_progress_bar_id, advance=0, visible=False)
            self.refresh(hard=True)

    def on_validation_end(self, trainer, pl_module):
        if trainer.state.fn == "fit":
            self._update_metrics(trainer, pl_module)
        self.reset_dataloader_idx_tracker()

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        if self.test_progress_bar_id is not None:
            self.progress.update(self.test_progress_bar_id, advance=0, visible=False)
        self.test_progress_bar_id = self._add_task(self.total_test_batches_current_dataloader, self.test_description)
        self.refresh(hard=True)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not self.is_disabled:
            self._update(self.test_progress_bar_id, batch_idx + 1)

    def on_test_end(self, trainer, pl_module):
        self.reset_dataloader_idx_tracker()

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        if self.predict_progress_bar_id is not None:
            self.progress.update(self.predict_progress_bar_id, advance=0, visible=False)
        self.predict_progress_bar_id = self._add_task(self.total_predict_batches_current_dataloader,
                                                      self.predict_description)
        self.refresh(hard=True)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not self.is_disabled:
            self._update(self.predict_progress_bar_id, batch_idx + 1)

    def on_predict_end(self, trainer, pl_module):
        self.reset_dataloader_idx_tracker()

    def teardown(self, trainer, pl_module, stage):
        self._stop_progress()

    def on_exception(self, trainer, pl_module, exception):
        self._stop_progress()

    # -- the metrics ----------------------------------------------------------------------------------------------
    def get_metrics(self, trainer, pl_module):
        """ProgressBar's metrics, tensors as Python numbers (what rich formats)."""
        return _items(super().get_metrics(trainer, pl_module))

    def _update_metrics(self, trainer, pl_module):
        if self.is_enabled and self._metric_component is not None:
            self._metric_component.update(self.get_metrics(trainer, pl_module))

    def __getstate__(self):
        # rich's console and display hold locks and threads, which do not pickle
        return {**vars(self), "progress": None, "_console": None, "_metric_component": None}


def _items(value):
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, dict):
        return {k: _items(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_items(v) for v in value)
    return value


def __getattr__(name):
    # Lightning's column classes live in its rich_progress module: the same names here, imported (with rich) on use
    if name in ("CustomBarColumn", "CustomInfiniteTask", "CustomProgress", "CustomTimeColumn",
                "BatchesProcessedColumn", "ProcessingSpeedColumn", "MetricsTextColumn"):
        from tasktrain.callbacks.progress import rich_columns

        return getattr(rich_columns, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
