"""RichProgressBar, Lightning's bar drawn with rich (the Trainer's default when rich is installed), and
RichProgressBarTheme, its styles. On rank 0: a training bar per epoch ("Epoch N/M", the bar, batches done / total,
elapsed • remaining, it/s, and the metrics of `get_metrics` as "name: value"), a validation bar during validation,
a bar per sanity check, test and predict loader; all on rich's console (Lightning's: `console_kwargs` reconfigures
rich's global console, so that rich's logging handler and prints share it).

As Lightning's: each batch updates its bar and asks for a redraw, and a training batch also reads `get_metrics`
(a host sync per displayed tensor); a thread redraws at most `refresh_rate` times a second, and only when asked
(in an interactive Python session every request redraws at once). `refresh_rate=0` draws nothing.

rich is imported when a bar starts drawing (rich_columns.py holds everything that subclasses rich), so that this
module, `import tasktrain` and `Trainer()` do not import it; rich's names and the column classes are this module's
attributes nonetheless, as in Lightning's module (`rich_progress.Progress`, `rich_progress.CustomBarColumn`, ...),
and the bar looks them up here, so that patching them here takes effect. Without rich (`_RICH_AVAILABLE`),
constructing a RichProgressBar is Lightning's ModuleNotFoundError."""
import sys
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from tasktrain.callbacks.progress import rich_available
from tasktrain.callbacks.progress.progress_bar import SwitchedProgressBar

_RICH_AVAILABLE = rich_available()
# Lightning's rule: in an interactive session (a REPL, `python -i`) every redraw request redraws at once
_IS_INTERACTIVE = hasattr(sys, "ps1") or bool(sys.flags.interactive)

_COLUMNS = ("CustomBarColumn", "CustomInfiniteTask", "CustomProgress", "CustomTimeColumn", "BatchesProcessedColumn",
            "ProcessingSpeedColumn", "MetricsTextColumn")
_RICH_NAMES = ("get_console", "reconfigure", "Progress", "ProgressColumn", "Task", "TaskID", "TextColumn",
               "BarColumn", "Text", "Style")


def _load_rich():
    """Bind rich's names and the columns in this module on first use; a name already bound (a test's mock.patch of
    `rich_progress.CustomProgress`, say) is kept."""
    import rich
    import rich.progress
    import rich.style
    import rich.text

    from tasktrain.callbacks.progress import rich_columns

    progress = rich.progress
    found = {"get_console": rich.get_console, "reconfigure": rich.reconfigure, "Text": rich.text.Text,
             "Style": rich.style.Style, "Progress": progress.Progress, "ProgressColumn": progress.ProgressColumn,
             "Task": progress.Task, "TaskID": progress.TaskID, "TextColumn": progress.TextColumn,
             "BarColumn": progress.BarColumn, **{name: getattr(rich_columns, name) for name in _COLUMNS}}
    for name, value in found.items():
        globals().setdefault(name, value)


def __getattr__(name):
    if name in _COLUMNS or name in _RICH_NAMES:
        _load_rich()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        if not _RICH_AVAILABLE:
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
        _load_rich()
        theme = self.theme
        return [TextColumn("[progress.description]{task.description}"),
                CustomBarColumn(complete_style=theme.progress_bar, finished_style=theme.progress_bar_finished,
                                pulse_style=theme.progress_bar_pulse),
                BatchesProcessedColumn(style=theme.batch_progress),
                CustomTimeColumn(style=theme.time),
                ProcessingSpeedColumn(style=theme.processing_speed)]

    def _init_progress(self, trainer):
        if not self.is_enabled or (self.progress is not None and not self._progress_stopped):
            return
        _load_rich()
        self._reset_progress_bar_ids()
        reconfigure(**self._console_kwargs)
        self._console = get_console()
        if getattr(self._console, "_live_stack", True):  # a display left live by an interrupted run (rich < 14.1
            self._console.clear_live()                   # has no stack: clear it always, as Lightning does)
        theme = self.theme
        self._metric_component = MetricsTextColumn(trainer, theme.metrics, theme.metrics_text_delimiter,
                                                   theme.metrics_format, bar=self)
        self.progress = CustomProgress(*self.configure_columns(trainer), self._metric_component, auto_refresh=True,
                                       refresh_per_second=self.refresh_rate, disable=self.is_disabled,
                                       console=self._console)
        self.progress.start()
        self._progress_stopped = False

    def refresh(self, hard: bool = False) -> None:
        """Redraw now if `hard` (or in an interactive session), else ask the redraw thread for one at its next tick
        (at most `refresh_rate` a second)."""
        if self.progress is not None:
            if hard or _IS_INTERACTIVE:
                self.progress.refresh()
            else:
                self.progress.soft_refresh()

    def _add_task(self, total_batches, description, visible=True):
        description = f"[{self.theme.description}]{description}" if self.theme.description else description
        return self.progress.add_task(description, total=total_batches, visible=visible)

    def _update(self, progress_bar_id, current, visible=True, hard=False):
        if self.progress is not None and self.is_enabled and progress_bar_id is not None:
            self.progress.update(progress_bar_id, completed=current, visible=visible)
            self.refresh(hard=hard)

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
        self.refresh()

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
        self.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.is_enabled and self.progress is not None and self.train_progress_bar_id is None:
            # resumed in the middle of an epoch: no on_train_epoch_start drew the bar
            self.train_progress_bar_id = self._add_task(self.total_train_batches,
                                                        self._get_train_description(trainer.current_epoch))
        self._update(self.train_progress_bar_id, batch_idx + 1)
        self._update_metrics(trainer, pl_module)  # every batch, as Lightning (a get_metrics override sees each)
        self.refresh()

    def on_train_epoch_end(self, trainer, pl_module):
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        which = "val_sanity_progress_bar_id" if trainer.sanity_checking else "val_progress_bar_id"
        if getattr(self, which) is not None:  # the previous loader's bar goes
            self.progress.update(getattr(self, which), advance=0, visible=False)
        description = self.sanity_check_description if trainer.sanity_checking else self.validation_description
        setattr(self, which, self._add_task(self.total_val_batches_current_dataloader, description, visible=False))
        self.refresh()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.is_disabled:
            return
        self._update(self.val_sanity_progress_bar_id if trainer.sanity_checking else self.val_progress_bar_id,
                     batch_idx + 1)

    def on_validation_epoch_end(self, trainer, pl_module):
        if self.is_enabled and self.val_progress_bar_id is not None and trainer.state.fn == "fit":
            self.progress.update(self.val_progress_bar_id, advance=0, visible=False)
            self.refresh()

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
        self.refresh()

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
        self.refresh()

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
