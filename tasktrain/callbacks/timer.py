import logging
import time
from datetime import timedelta
from typing import Optional, Union

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
        raise MisconfigurationException(f"`Timer(duration={duration!r})` is not a valid duration. Expected a string "
                                        "in the format DD:HH:MM:SS (or a timedelta, a dict like {'hours': 1}, or "
                                        "seconds).")
    days, hours, minutes, seconds = (float(p) for p in parts)
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


log = logging.getLogger("tasktrain")  # Lightning logs this on its package logger (rank_zero_info)

_STAGES = ("train", "sanity_check", "validate", "test", "predict")  # Lightning's RunningStage values


class Timer(Callback):
    """Stop training once a wall-clock budget is spent, checked after each optimizer step (interval="step") or each
    training epoch (interval="epoch"); duration=None only measures. time_elapsed(stage) / time_remaining(stage)
    give the seconds of "train" (including the runs this one resumed), "validate" or "test", as in Lightning."""

    def __init__(
        self,
        duration: Optional[Union[str, timedelta, dict[str, int]]] = None,
        interval: str = "step",
        verbose: bool = True,
    ):
        if interval not in ("step", "epoch"):
            raise MisconfigurationException(f"Unsupported parameter value `Timer(interval={interval})`. Possible "
                                            "choices are: step, epoch")
        # Lightning's private names (subclasses and Lightning's tests read them): the budget in seconds
        self._duration = None if duration is None else parse_duration(duration).total_seconds()
        self._interval = interval
        self._verbose = verbose
        self._start_time = dict.fromkeys(_STAGES)
        self._end_time = dict.fromkeys(_STAGES)
        self._offset = 0.0  # training seconds of the earlier runs this one resumed

    @property
    def duration(self):
        """The budget as a timedelta (None: it only measures)."""
        return None if self._duration is None else timedelta(seconds=self._duration)

    @property
    def interval(self):
        return self._interval

    @property
    def verbose(self):
        return self._verbose

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
        return None if self._duration is None else self._duration - self.time_elapsed(stage)

    def elapsed(self) -> float:
        """The training seconds so far (time_elapsed("train"))."""
        return self.time_elapsed("train")

    def _started(self, stage):
        self._start_time[stage], self._end_time[stage] = time.monotonic(), None

    def _ended(self, stage):
        self._end_time[stage] = time.monotonic()

    def on_train_start(self, trainer, pl_module):
        self._started("train")

    def on_train_end(self, trainer, pl_module):
        self._ended("train")

    def on_validation_start(self, trainer, pl_module):
        self._started("validate")

    def on_validation_end(self, trainer, pl_module):
        self._ended("validate")

    def on_test_start(self, trainer, pl_module):
        self._started("test")

    def on_test_end(self, trainer, pl_module):
        self._ended("test")

    def _check(self, trainer):
        if self._duration is None:
            return
        up = self.time_elapsed() >= self._duration
        if trainer.world_size > 1:  # rank 0's clock for every rank (every rank reaches this broadcast)
            up = bool(trainer.strategy.broadcast(up))
        if up:
            trainer.should_stop = True
            if self._verbose and trainer.is_global_zero:  # Lightning's message; the "tasktrain" logger prints INFO
                elapsed = timedelta(seconds=int(self.time_elapsed()))
                log.info(f"Time limit reached. Elapsed time is {elapsed}. Signaling Trainer to stop.")

    def on_fit_start(self, trainer, *args, **kwargs):
        # after a resume's state is loaded (Lightning's rule): a budget already spent stops before the first step
        self._check(trainer)

    def on_train_batch_end(self, trainer, *args, **kwargs):
        if self._interval == "step":
            self._check(trainer)

    def on_train_epoch_end(self, trainer, *args, **kwargs):
        if self._interval == "epoch":
            self._check(trainer)

    def state_dict(self):
        # Lightning's layout (load_state_dict still reads the "elapsed" of older checkpoints)
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in _STAGES}}

    def load_state_dict(self, state_dict):
        elapsed = state_dict.get("time_elapsed", {}).get("train", state_dict.get("elapsed", 0.0))
        self._offset = float(elapsed)


def _stage(stage):
    stage = getattr(stage, "value", stage)
    if stage not in _STAGES:
        raise ValueError(f"Timer: stage={stage!r}: use one of {', '.join(_STAGES)}.")
    return stage
