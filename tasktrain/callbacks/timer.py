import time
from datetime import timedelta

from tasktrain.callbacks.base import Callback


def parse_duration(duration) -> timedelta:
    if isinstance(duration, timedelta):
        return duration
    if isinstance(duration, dict):
        return timedelta(**duration)
    if isinstance(duration, (int, float)):
        return timedelta(seconds=duration)
    parts = str(duration).split(":")
    if len(parts) != 4:
        raise ValueError(f"Timer(duration={duration!r}): use 'DD:HH:MM:SS', a timedelta, a dict like "
                         "{'hours': 1}, or seconds.")
    days, hours, minutes, seconds = (float(p) for p in parts)
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


class Timer(Callback):
    """Stop training once a wall-clock budget is spent (checked after each optimizer step and epoch)."""

    def __init__(self, duration="00:01:00:00"):
        self.duration = parse_duration(duration)
        self._start = None
        self._elapsed_before = 0.0  # from earlier runs this one resumed

    def elapsed(self) -> float:
        return self._elapsed_before + (time.monotonic() - self._start if self._start is not None else 0.0)

    def on_train_start(self, trainer, module):
        self._start = time.monotonic()

    def _check(self, trainer):
        if self.elapsed() >= self.duration.total_seconds() and not trainer.should_stop:
            trainer.should_stop = True
            if trainer.is_global_zero:
                print(f"[tasktrain] Timer: the time budget of {self.duration} is spent; stopping.", flush=True)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._check(trainer)

    def on_train_epoch_end(self, trainer, module):
        self._check(trainer)

    def state_dict(self):
        return {"elapsed": self.elapsed()}

    def load_state_dict(self, state):
        self._elapsed_before = float(state.get("elapsed", 0.0))
