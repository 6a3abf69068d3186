"""TQDMProgressBar, the Trainer's default progress bar (Lightning's): on rank 0, a training bar per epoch
("Epoch N", batches done / total, rate, the metrics of `get_metrics`), a validation bar below it during validation,
a bar per sanity check, test and predict run; all written to sys.stdout by `Tqdm`.

The one liberty taken: the bars redraw at most every `refresh_interval` seconds (0.1, tqdm's own default) besides
Lightning's `refresh_rate`, and always at a loop's last batch. What Lightning does at each update is still done then:
`bar.n` is set and the postfix is set from `get_metrics` (a host sync per metric shown, as Lightning's), so a
`get_metrics` override is called as under Lightning; only the terminal write waits. Set `refresh_interval = 0` for a
redraw at every `refresh_rate` batches, exactly Lightning's."""
import math
import os
import sys
import time

from tqdm import tqdm as _tqdm

from tasktrain.callbacks.progress.progress_bar import SwitchedProgressBar

_PAD_SIZE = 5


class Tqdm(_tqdm):
    """tqdm whose numbers are padded with zeros to a fixed width (float and string values), so that the postfix
    does not flicker as digits come and go."""

    @staticmethod
    def format_num(n):
        padded = isinstance(n, (float, str))
        if not isinstance(n, str):
            n = _tqdm.format_num(n)
        if padded and "e" not in n:
            if "." not in n and len(n) < _PAD_SIZE:
                try:
                    float(n)
                except ValueError:
                    return n
                n += "."
            n += "0" * (_PAD_SIZE - len(n))
        return n


class TQDMProgressBar(SwitchedProgressBar):
    """`refresh_rate`: batches between updates (0: nothing is drawn); `process_position`: lines to offset the bars
    by (bars of other programs above them); `leave`: keep each epoch's finished training bar on screen."""

    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"
    refresh_interval = 0.1  # seconds between redraws at least (see the module's docstring)

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False):
        super().__init__()
        self._refresh_rate = _resolve_refresh_rate(refresh_rate)
        self._process_position = process_position
        self._enabled = True
        self._train_progress_bar = self._val_progress_bar = None
        self._test_progress_bar = self._predict_progress_bar = None
        self._leave = leave

    def __getstate__(self):
        return {k: None if isinstance(v, _tqdm) else v for k, v in vars(self).items()}

    # -- the bars -------------------------------------------------------------------------------------------------
    def _bar(name):
        def get(self):
            bar = getattr(self, f"_{name}")
            if bar is None:
                raise TypeError(f"The `{type(self).__name__}._{name}` reference has not been set yet.")
            return bar

        def set(self, bar):
            setattr(self, f"_{name}", bar)

        return property(get, set)

    train_progress_bar = _bar("train_progress_bar")
    val_progress_bar = _bar("val_progress_bar")
    test_progress_bar = _bar("test_progress_bar")
    predict_progress_bar = _bar("predict_progress_bar")
    del _bar

    @property
    def process_position(self):
        return self._process_position

    def _tqdm(self, desc, position, leave, **extra):
        return Tqdm(desc=desc, position=position, disable=self.is_disabled, leave=leave, dynamic_ncols=True,
                    file=sys.stdout, bar_format=self.BAR_FORMAT, **extra)

    def init_sanity_tqdm(self):
        """The sanity check's bar (override to customize)."""
        return self._tqdm(self.sanity_check_description, 2 * self.process_position, False)

    def init_train_tqdm(self):
        """The training bar (override to customize)."""
        return self._tqdm(self.train_description, 2 * self.process_position, True, smoothing=0)

    def init_predict_tqdm(self):
        return self._tqdm(self.predict_description, 2 * self.process_position, True, smoothing=0)

    def init_validation_tqdm(self):
        """The validation bar: below the training bar during fit, on its own in validate()."""
        has_main_bar = self.trainer.state.fn != "validate"
        return self._tqdm(self.validation_description, 2 * self.process_position + has_main_bar, not has_main_bar)

    def init_test_tqdm(self):
        return self._tqdm("Testing", 2 * self.process_position, True)

    # -- sanity check and training --------------------------------------------------------------------------------
    def on_sanity_check_start(self, *_):
        self.val_progress_bar = self.init_sanity_tqdm()
        self.train_progress_bar = Tqdm(disable=True)  # a placeholder while the sanity check runs

    def on_sanity_check_end(self, *_):
        self.val_progress_bar.close()
        self.train_progress_bar.close()

    def on_train_start(self, *_):
        self.train_progress_bar = self.init_train_tqdm()

    def on_train_epoch_start(self, trainer, *_):
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        _restart(self.train_progress_bar, self.total_train_batches, f"Epoch {trainer.current_epoch}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        bar = self._train_progress_bar
        if bar is not None and not bar.disable and self._should_update(batch_idx + 1, bar.total):
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)  # drawn by _update when due
            self._update(bar, batch_idx + 1)

    def on_train_epoch_end(self, trainer, pl_module):
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
        if self._leave:
            self.train_progress_bar.close()

    def on_train_end(self, *_):
        self.train_progress_bar.close()

    # -- evaluation -----------------------------------------------------------------------------------------------
    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.val_progress_bar = self.init_validation_tqdm()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.has_dataloader_changed(dataloader_idx):
            desc = self.sanity_check_description if trainer.sanity_checking else self.validation_description
            _restart(self.val_progress_bar, self.total_val_batches_current_dataloader,
                     f"{desc} DataLoader {dataloader_idx}")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self._val_progress_bar is not None:
            self._update(self._val_progress_bar, batch_idx + 1)

    def on_validation_end(self, trainer, pl_module):
        self.val_progress_bar.close()
        self.reset_dataloader_idx_tracker()
        if self._train_progress_bar is not None and trainer.state.fn == "fit":
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_test_start(self, trainer, pl_module):
        self.test_progress_bar = self.init_test_tqdm()

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.has_dataloader_changed(dataloader_idx):
            _restart(self.test_progress_bar, self.total_test_batches_current_dataloader,
                     f"{self.test_description} DataLoader {dataloader_idx}")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self._test_progress_bar is not None:
            self._update(self._test_progress_bar, batch_idx + 1)

    def on_test_end(self, trainer, pl_module):
        self.test_progress_bar.close()
        self.reset_dataloader_idx_tracker()

    def on_predict_start(self, trainer, pl_module):
        self.predict_progress_bar = self.init_predict_tqdm()

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.has_dataloader_changed(dataloader_idx):
            _restart(self.predict_progress_bar, self.total_predict_batches_current_dataloader,
                     f"{self.predict_description} DataLoader {dataloader_idx}")

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self._predict_progress_bar is not None:
            self._update(self._predict_progress_bar, batch_idx + 1)

    def on_predict_end(self, trainer, pl_module):
        self.predict_progress_bar.close()
        self.reset_dataloader_idx_tracker()

    def print(self, *args, sep=" ", **kwargs):
        """Print above the active bar (tqdm.write), so that the bar is not broken."""
        for bar in (self._train_progress_bar, self._val_progress_bar, self._test_progress_bar,
                    self._predict_progress_bar):
            if bar is not None and not bar.disable:
                bar.write(sep.join(map(str, args)), **kwargs)
                return

    # -- updates --------------------------------------------------------------------------------------------------
    def _should_update(self, current, total):
        return self.is_enabled and (current % self.refresh_rate == 0 or current == total)

    def _update(self, bar, n):
        """Lightning's update of `bar` to `n` batches; the redraw also waits for refresh_interval. True: redrawn."""
        if bar.disable or not self._should_update(n, bar.total):
            return False
        bar.n = n
        now = time.perf_counter()  # (the display's own clock, not time.monotonic: val_check_interval's and the Timer's)
        if n != bar.total and now - getattr(bar, "drawn_at", -math.inf) < self.refresh_interval:
            return False
        bar.drawn_at = now
        bar.refresh()
        return True


def convert_inf(x):
    """Lightning's helper, for bars of one's own: tqdm's total for a count (None for an unknown or infinite one, which
    tqdm cannot show)."""
    if x is None or math.isinf(x) or math.isnan(x):
        return None
    return x


def _update_n(bar, value):
    """Lightning's helper, for bars of one's own: set a drawn bar's count and redraw it."""
    if not bar.disable:
        bar.n = value
        bar.refresh()


def _restart(bar, total, description):
    bar.reset()
    bar.total = convert_inf(total)
    bar.initial = 0
    bar.set_description(description)


def _resolve_refresh_rate(refresh_rate):
    if os.getenv("COLAB_GPU") and refresh_rate == 1:
        return 20  # a notebook's output is slow to redraw
    if "TQDM_MINITERS" in os.environ:
        return max(int(os.environ["TQDM_MINITERS"]), refresh_rate)
    return refresh_rate
