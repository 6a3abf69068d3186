"""The rich parts of RichProgressBar (Lightning's columns and display): imported when a RichProgressBar starts drawing,
never by `import tasktrain`, since every class here subclasses one of rich's."""
import math
import threading
from datetime import timedelta

from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID
from rich.progress_bar import ProgressBar as _RichBar
from rich.text import Text


class CustomBarColumn(BarColumn):
    """The bar; a loader without a length (total inf) pulses instead of filling."""

    def render(self, task):
        return _RichBar(total=max(0, task.total), completed=max(0, task.completed),
                        width=None if self.bar_width is None else max(1, self.bar_width),
                        pulse=not task.started or not math.isfinite(task.remaining), animation_time=task.get_time(),
                        style=self.style, complete_style=self.complete_style, finished_style=self.finished_style,
                        pulse_style=self.pulse_style)


class CustomInfiniteTask(Task):
    """A task of unknown length: no time remaining."""

    @property
    def time_remaining(self):
        return None


class _RedrawThread(threading.Thread):
    """Lightning's redraw thread: every 1/refresh_per_second seconds it redraws the display if the loop asked for a
    redraw since the last one (`wanted`), so that a batch only sets a flag and never waits for rich to render.
    rich's Live calls `stop()` when the display stops."""

    def __init__(self, live, refresh_per_second):
        super().__init__(daemon=True, name="tasktrain-rich-progress")
        self.live = live
        self.refresh_per_second = refresh_per_second
        self.wanted = False
        self.done = threading.Event()

    def stop(self):
        self.done.set()

    def run(self):
        while not self.done.wait(1 / self.refresh_per_second):
            if self.wanted:
                self.wanted = False
                with self.live._lock:
                    if not self.done.is_set():
                        self.live.refresh()


class CustomProgress(Progress):
    """rich's Progress redrawn by a `_RedrawThread` on request (`soft_refresh`) instead of rich's own thread, which
    redraws at every tick whether anything changed or not; it also takes tasks of infinite total (a loader without
    a length)."""

    def start(self):
        auto = self.live.auto_refresh and not self.disable
        if auto:  # rich's Live starts its own thread when auto_refresh is set: ours instead
            self.live.auto_refresh = False
        super().start()
        if auto:
            self.live.auto_refresh = True  # so that Live.stop stops our thread
            self.live._refresh_thread = _RedrawThread(self.live, self.live.refresh_per_second)
            self.live._refresh_thread.start()

    def stop(self):
        thread = self.live._refresh_thread
        super().stop()
        if thread is not None:
            thread.stop()
            thread.join()

    def soft_refresh(self):
        """Ask the redraw thread for a redraw at its next tick."""
        thread = self.live._refresh_thread
        if self.live.auto_refresh and isinstance(thread, _RedrawThread):
            thread.wanted = True

    def add_task(self, description, start=True, total=100.0, completed=0, visible=True, **fields):
        if math.isfinite(total):
            return super().add_task(description, start, total, completed, visible, **fields)
        with self._lock:
            task_id = self._task_index
            self._tasks[task_id] = CustomInfiniteTask(task_id, description, total, completed, visible=visible,
                                                      fields=fields, _get_time=self.get_time, _lock=self._lock)
            self._task_index = TaskID(int(task_id) + 1)
        if start:
            self.start_task(task_id)
        self.refresh()
        return task_id


class CustomTimeColumn(ProgressColumn):
    """"elapsed • remaining" (H:MM:SS), redrawn twice a second at most so that it does not jitter."""
    max_refresh = 0.5

    def __init__(self, style):
        self.style = style
        super().__init__()

    def render(self, task):
        elapsed = task.finished_time if task.finished else task.elapsed
        remaining = task.time_remaining
        shown = ["-:--:--" if t is None else str(timedelta(seconds=int(t))) for t in (elapsed, remaining)]
        return Text(" • ".join(shown), style=self.style)


class BatchesProcessedColumn(ProgressColumn):
    """"done/total" ("--" for the total of a loader without a length)."""

    def __init__(self, style):
        self.style = style
        super().__init__()

    def render(self, task):
        total = task.total if task.total != float("inf") else "--"
        return Text(f"{int(task.completed)}/{total}", style=self.style)


class ProcessingSpeedColumn(ProgressColumn):
    def __init__(self, style):
        self.style = style
        super().__init__()

    def render(self, task):
        return Text(f"{task.speed:>.2f}it/s" if task.speed is not None else "0.00it/s", style=self.style)


class MetricsTextColumn(ProgressColumn):
    """The metrics of the bar's `get_metrics`, on the training bar of a fit only ("name: value", floats formatted
    with the theme's `metrics_format`). The values are handed over by `update` from the training loop, so that a
    redraw (on the redraw thread) never reads a tensor itself."""

    def __init__(self, trainer, style, text_delimiter, metrics_format, bar=None):
        self._trainer = trainer
        self._bar = bar
        self._metrics = {}
        self._style = style
        self._text_delimiter = text_delimiter
        self._metrics_format = metrics_format
        super().__init__()

    def update(self, metrics):
        self._metrics = metrics

    def render(self, task):
        trainer = self._trainer
        bar = self._bar if self._bar is not None else trainer.progress_bar_callback
        if trainer.state.fn != "fit" or trainer.sanity_checking or bar.train_progress_bar_id != task.id:
            return Text()
        return Text(self._text_delimiter.join(self._generate_metrics_texts()), justify="left", style=self._style)

    def _generate_metrics_texts(self):
        for name, value in self._metrics.items():
            if not isinstance(value, str):
                try:
                    value = f"{value:{self._metrics_format}}"
                except (TypeError, ValueError):
                    value = str(value)
            yield f"{name}: {value}"
