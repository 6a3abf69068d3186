"""ProgressBar on tqdm: one bar per epoch on a terminal, one plain line per epoch in logs (CI, files)."""
import sys
import time

from tasktrain.callbacks.base import Callback


class ProgressBar(Callback):
    def __init__(self, refresh_rate: int = 1, min_interval: float = 0.1, leave: bool = True, file=None):
        """Refresh at most every `refresh_rate` batches and every `min_interval` seconds; metrics are read then."""
        if refresh_rate < 1:
            raise ValueError(f"ProgressBar(refresh_rate={refresh_rate}): use a positive number of batches.")
        self.refresh_rate = refresh_rate
        self.min_interval = min_interval
        self.leave = leave
        self.file = file
        self.bar = None
        self.val_bar = None
        self._pending = 0
        self._last = 0.0
        self._epoch_start = 0.0
        self._batches = 0

    def _enabled(self, trainer):
        return trainer.is_global_zero

    def _stream(self):
        return self.file or sys.stderr

    def _is_tty(self):
        stream = self._stream()
        return hasattr(stream, "isatty") and stream.isatty()

    # -- training -----------------------------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer, module):
        if not self._enabled(trainer):
            return
        self._epoch_start = time.monotonic()
        self._batches = 0
        self._pending = 0
        if self._is_tty():
            from tqdm.auto import tqdm

            epochs = f"/{trainer.max_epochs}" if trainer.max_epochs != -1 else ""
            self.bar = tqdm(total=trainer.num_training_batches, desc=f"Epoch {trainer.current_epoch}{epochs}",
                            initial=trainer.state.batch_in_epoch, leave=self.leave, file=self._stream(),
                            dynamic_ncols=True, unit="it", mininterval=0)

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
        self.bar.set_postfix(_fmt(trainer.progress_bar_metrics), refresh=False)
        self.bar.update(self._pending)
        self._pending = 0

    def on_train_epoch_end(self, trainer, module):
        if not self._enabled(trainer):
            return
        metrics = _fmt(trainer.progress_bar_metrics)
        if self.bar is not None:
            self.bar.set_postfix(metrics, refresh=False)
            self.bar.update(self._pending)
            self._pending = 0
            self.bar.close()
            self.bar = None
        else:
            seconds = time.monotonic() - self._epoch_start
            rate = self._batches / seconds if seconds > 0 else 0.0
            epochs = f"/{trainer.max_epochs}" if trainer.max_epochs != -1 else ""
            items = "".join(f", {k}={v}" for k, v in metrics.items())
            print(f"Epoch {trainer.current_epoch}{epochs}: {self._batches} batches in {seconds:.1f}s "
                  f"({rate:.1f} it/s), step {trainer.global_step}{items}", file=self._stream(), flush=True)

    def on_train_end(self, trainer, module):
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    # -- validation ---------------------------------------------------------------------------------------------------
    def on_validation_epoch_start(self, trainer, module):
        if self._enabled(trainer) and self._is_tty() and not trainer.sanity_checking:
            from tqdm.auto import tqdm

            self.val_bar = tqdm(desc="Validation", leave=False, file=self._stream(), dynamic_ncols=True)

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.val_bar is not None:
            self.val_bar.update(1)

    def on_validation_end(self, trainer, module):
        if self.val_bar is not None:
            self.val_bar.close()
            self.val_bar = None


def _fmt(metrics):
    return {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in sorted(metrics.items())}
