"""LearningRateFinder: Lightning's callback that sweeps the learning rate at the start of a fit.

It runs the sweep of tasktrain.tuner (tuning.find_lr: the Tuner's own) from inside the fit: at on_fit_start, or
from any hook of a subclass that calls `self.lr_find(trainer, pl_module)` (at epoch milestones, say, when
fine-tuning). The suggestion is set on the module's `lr` / `learning_rate` (or attr_name) and on the optimizers the
fit already built, so the fit goes on at that rate. See docs/tuner.md.
"""
from typing import Optional

from tasktrain.callbacks.base import Callback


class LearningRateFinder(Callback):
    """A learning-rate range test: `num_training_steps` steps with the rate growing from min_lr to max_lr ("exponential"
    or "linear" mode), stopped once the smoothed loss passes early_stop_threshold x its best (None: never). The
    result is `optimal_lr`: an LRFinder (`results`, `suggestion()`), None before the sweep and under fast_dev_run
    (skipped with Lightning's warning). update_attr: set the suggestion on the module (attr_name, else `lr` or
    `learning_rate`, an attribute or a hyper-parameter)."""

    SUPPORTED_MODES = ("linear", "exponential")

    def __init__(
        self,
        min_lr: float = 1e-8,
        max_lr: float = 1,
        num_training_steps: int = 100,
        mode: str = "exponential",
        early_stop_threshold: Optional[float] = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
    ):
        from tasktrain.tuner.tuning import check_lr_find_arguments

        mode = mode.lower()
        check_lr_find_arguments(mode)  # (Lightning's words: a ValueError)
        self._min_lr = min_lr
        self._max_lr = max_lr
        self._num_training_steps = num_training_steps
        self._mode = mode
        self._early_stop_threshold = early_stop_threshold
        self._update_attr = update_attr
        self._attr_name = attr_name
        self.optimal_lr = None
        self._early_exit = False  # (Lightning's flag) set by the Tuner: its run ends once the sweep is done

    def lr_find(self, trainer, pl_module):
        """Run the sweep now (from any hook of the fit); sets `optimal_lr` and, with update_attr, the rate."""
        from tasktrain.tuner.tuning import find_lr, run_loaders

        self.optimal_lr = find_lr(trainer, pl_module, run_loaders(trainer), self._min_lr, self._max_lr,
                                  self._num_training_steps, self._mode, self._early_stop_threshold, self._update_attr,
                                  self._attr_name)
        if self._early_exit:
            from tasktrain.exceptions import _TunerExitException

            raise _TunerExitException()

    def on_fit_start(self, trainer, pl_module):
        self.lr_find(trainer, pl_module)
