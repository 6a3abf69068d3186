"""ProgressBar on tqdm: one bar per epoch on a terminal, one plain line per epoch in logs (CI, files).

On a terminal: a bar per training epoch (batches done / total, rate, the prog_bar=True metrics) and a
transient bar for each validation or test run. Elsewhere (output redirected, a StringIO): no carriage returns,
one line per epoch when it ends. Only rank 0 shows anything. Metrics are read (a host sync for each displayed
tensor) only when the bar refreshes: every `refresh_rate` batches at most, and not more often than
`min_interval` seconds; metrics that are not displayed are never read.
"""
import sys
import time
import warnings

from tasktrain.callbacks.base import Callback


class ProgressBar(Callback):
    def __init__(self, refresh_rate: int = 1, min_interval: float = 0.1, leave: bool = True, file=None):
        if not isinstance(refresh_rate, int) or refresh_rate < 1:
            raise ValueError(f"ProgressBar(refresh_rate={refresh_rate!r}): use a positive number of batches.")
        self.refresh_rate = refresh_rate
        self.min_interval = min_interval
        self.leave = leave
        self.file = file
        self.bar = None
        self.eval_bar = None
        self._pending = 0
        self._last = 0.0
        self._epoch_start = 0.0
        self._batches = 0

    def _stream(self):
        return self.file or sys.stderr

    def _is_tty(self):
        stream = self._stream()
        return hasattr(stream, "isatty") and stream.isatty()

    def _epochs(self, trainer):
        return f"/{trainer.max_epochs}" if trainer.max_epochs != -1 else ""

    # -- training -----------------------------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer, module):
        if not trainer.is_global_zero:
            return
        self._epoch_start = time.monotonic()
        self._batches = 0
        self._pending = 0
        self._last = 0.0
        if self._is_tty():
            from tqdm import tqdm

            self.bar = tqdm(total=trainer.num_training_batches, desc=f"Epoch {trainer.current_epoch}"
                            f"{self._epochs(trainer)}", initial=trainer.state.batch_in_epoch, leave=self.leave,
                            file=self._stream(), dynamic_ncols=True, unit="it", mininterval=0)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._batches += 1
        if self.bar is None:
            return
        self._pending += 1
        if self._pending % self.refresh_rate:
            return
        now = time.monotonic()
        if now - self._last < self.min_interval:
            return
        self._last = now
        self.bar.set_postfix(_fmt(self.get_metrics(trainer, module)), refresh=False)
        self.bar.update(self._pending)
        self._pending = 0

    def on_train_epoch_end(self, trainer, module):
        if not trainer.is_global_zero:
            return
        metrics = _fmt(self.get_metrics(trainer, module))
        if self.bar is not None:
            self.bar.set_postfix(metrics, refresh=False)
            self.bar.update(self._pending)
            self._pending = 0
            self.bar.close()
            self.bar = None
        else:
            seconds = time.monotonic() - self._epoch_start
            rate = self._batches / seconds if seconds > 0 else 0.0
            items = "".join(f", {k}={v}" for k, v in metrics.items())
            print(f"Epoch {trainer.current_epoch}{self._epochs(trainer)}: {self._batches} batches in {seconds:.1f}s "
                  f"({rate:.1f} it/s), step {trainer.global_step}{items}", file=self._stream(), flush=True)

    def on_train_end(self, trainer, module):
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def on_exception(self, trainer, module, exception):
        for bar in (self.bar, self.eval_bar):
            if bar is not None:
                bar.close()
        self.bar = self.eval_bar = None

    def get_metrics(self, trainer, module):
        """What the bar shows (Lightning's): the logger's version as "v_num" (its last 4 characters when it is a
        string), then the values logged with prog_bar=True. Override it to change what is displayed."""
        standard = {}
        versions = []
        for logger in trainer.loggers:
            version = getattr(logger, "version", None)
            if version not in versions:
                versions.append(version)
        version = versions[0] if len(versions) == 1 else "_".join(str(v) for v in versions) if versions else None
        if version not in ("", None):
            standard["v_num"] = version[-4:] if isinstance(version, str) else version
        shown = trainer.progress_bar_metrics
        duplicates = sorted(standard.keys() & shown.keys())
        if duplicates and not getattr(self, "_warned_duplicates", False):
            self._warned_duplicates = True
            warnings.warn(f"The progress bar already shows {', '.join(duplicates)}; the value logged under that name "
                          "with prog_bar=True replaces it. Rename it, or override get_metrics().")
        return {**standard, **shown}

    # -- validation and test: a transient bar on a terminal ----------------------------------------------------------
    def _open_eval_bar(self, trainer, desc):
        if not (trainer.is_global_zero and self._is_tty()) or trainer.sanity_checking:
            return
        from tqdm import tqdm

        self.eval_bar = tqdm(desc=desc, total=_eval_total(trainer, desc), leave=False, file=self._stream(),
                             dynamic_ncols=True, unit="it")

    def _advance_eval_bar(self):
        if self.eval_bar is not None:
            self.eval_bar.update(1)

    def _close_eval_bar(self):
        if self.eval_bar is not None:
            self.eval_bar.close()
            self.eval_bar = None

    def on_validation_epoch_start(self, trainer, module):
        self._open_eval_bar(trainer, "Validation")

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        self._advance_eval_bar()

    def on_validation_end(self, trainer, module):
        self._close_eval_bar()

    def on_test_epoch_start(self, trainer, module):
        self._open_eval_bar(trainer, "Test")

    def on_test_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        self._advance_eval_bar()

    def on_test_end(self, trainer, module):
        self._close_eval_bar()


def _eval_total(trainer, desc):
    """The number of batches of the run that starts (None where the loader has no length)."""
    counts = trainer.num_val_batches if desc == "Validation" else trainer.num_test_batches
    return sum(counts) if counts and None not in counts else None  # all the loaders of the run


def _fmt(metrics):
    return {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in sorted(metrics.items())}
