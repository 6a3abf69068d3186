import time
from datetime import timedelta

from tasktrain.callbacks.base import Callback
from tasktrain.exceptions import MisconfigurationException


def parse_duration(duration) -> timedelta:
    if isinstance(duration, timedelta):
        return duration
    if isinstance(duration, dict):
        return timedelta(**duration)
    if isinstance(duration, (int, float)):
        return timedelta(seconds=duration)
    parts = str(duration).split(":")
    if len(parts) != 4:
        raise MisconfigurationException(f"Timer(duration={duration!r}): use 'DD:HH:MM:SS', a timedelta, a dict like "
                         "{'hours': 1}, or seconds.")
    days, hours, minutes, seconds = (float(p) for p in parts)
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


_STAGES = ("train", "sanity_check", "validate", "test", "predict")  # Lightning's RunningStage values


class Timer(Callback):
    """Stop training once a wall-clock budget is spent, checked after each optimizer step (interval="step") or each
    training epoch (interval="epoch"); duration=None only measures. time_elapsed(stage) / time_remaining(stage)
    give the seconds of "train" (including the runs this one resumed), "validate" or "test", as in Lightning."""

    def __init__(self, duration=None, interval="step", verbose=True):
        if interval not in ("step", "epoch"):
            raise MisconfigurationException(f"Unsupported parameter value `Timer(interval={interval})`. Possible "
                                            "choices are: step, epoch")
        self.duration = None if duration is None else parse_duration(duration)
        self.interval = interval
        self.verbose = verbose
        self._start_time = dict.fromkeys(_STAGES)
        self._end_time = dict.fromkeys(_STAGES)
        self._offset = 0.0  # training seconds of the earlier runs this one resumed

    def start_time(self, stage="train"):
        return self._start_time[_stage(stage)]

    def end_time(self, stage="train"):
        return self._end_time[_stage(stage)]

    def time_elapsed(self, stage="train") -> float:
        stage = _stage(stage)
        start, end = self._start_time[stage], self._end_time[stage]
        offset = self._offset if stage == "train" else 0.0
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage="train"):
        return None if self.duration is None else self.duration.total_seconds() - self.time_elapsed(stage)

    def elapsed(self) -> float:
        """The training seconds so far (time_elapsed("train"))."""
        return self.time_elapsed("train")

    def _started(self, stage):
        self._start_time[stage], self._end_time[stage] = time.monotonic(), None

    def _ended(self, stage):
        self._end_time[stage] = time.monotonic()

    def on_train_start(self, trainer, module):
        self._started("train")

    def on_train_end(self, trainer, module):
        self._ended("train")

    def on_validation_start(self, trainer, module):
        self._started("validate")

    def on_validation_end(self, trainer, module):
        self._ended("validate")

    def on_test_start(self, trainer, module):
        self._started("test")

    def on_test_end(self, trainer, module):
        self._ended("test")

    def _check(self, trainer):
        if self.duration is None:
            return
        up = self.time_elapsed() >= self.duration.total_seconds()
        if trainer.world_size > 1:  # rank 0's clock for every rank (every rank reaches this broadcast)
            up = bool(trainer.strategy.broadcast(up))
        if up:
            trainer.should_stop = True
            if self.verbose and trainer.is_global_zero:
                elapsed = timedelta(seconds=int(self.time_elapsed()))
                print(f"Time limit reached. Elapsed time is {elapsed}. Signaling Trainer to stop.", flush=True)

    def on_fit_start(self, trainer, module):
        # after a resume's state is loaded (Lightning's rule): a budget already spent stops before the first step
        self._check(trainer)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.interval == "step":
            self._check(trainer)

    def on_train_epoch_end(self, trainer, module):
        if self.interval == "epoch":
            self._check(trainer)

    def state_dict(self):
        # Lightning's layout (load_state_dict still reads the "elapsed" of older checkpoints)
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in _STAGES}}

    def load_state_dict(self, state):
        elapsed = state.get("time_elapsed", {}).get("train", state.get("elapsed", 0.0))
        self._offset = float(elapsed)


def _stage(stage):
    stage = getattr(stage, "value", stage)
    if stage not in _STAGES:
        raise ValueError(f"Timer: stage={stage!r}: use one of {', '.join(_STAGES)}.")
    return stage
