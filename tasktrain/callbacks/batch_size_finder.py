"""BatchSizeFinder: Lightning's callback that finds the largest batch size that fits, at the start of a run.

It runs the search of tasktrain.tuner (tuning.find_batch_size: the Tuner's own) from inside the run: at
on_fit_start, or at the start of a validate / test / predict run, or from any hook of a subclass that calls
`self.scale_batch_size(trainer, pl_module)` (at epoch milestones, say, after unfreezing a backbone). The size is set
on the module's (or its hparams', or the DataModule's) attribute, which their *_dataloader hooks read; the run goes
on with loaders built again at that size. See docs/tuner.md.
"""
import warnings

from tasktrain.callbacks.base import Callback


class BatchSizeFinder(Callback):
    """Finds the largest batch size with which `steps_per_trial` steps run without running out of memory.

    mode: "power" (double until a trial runs out of memory) or "binsearch" (then bisect between the last size that
    fitted and the first that failed, and take `margin` off); steps_per_trial, init_val, max_trials, batch_arg_name
    (the attribute of the module, its hparams or the DataModule), margin (0 <= margin < 1, binsearch only), max_val
    (the largest size tried). The size found is `optimal_batch_size` (init_val until then; None under
    fast_dev_run, which skips the search with Lightning's warning)."""

    SUPPORTED_MODES = ("power", "binsearch")

    def __init__(
        self,
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        margin: float = 0.05,
        max_val: int = 8192,
    ):
        from tasktrain.tuner.tuning import check_batch_size_arguments

        mode = mode.lower()
        check_batch_size_arguments(mode, margin)  # (Lightning's words and types: ValueError, AssertionError)
        self.optimal_batch_size = init_val
        self._mode = mode
        self._steps_per_trial = steps_per_trial
        self._init_val = init_val
        self._max_trials = max_trials
        self._batch_arg_name = batch_arg_name
        self._margin = margin
        self._max_val = max_val
        self._early_exit = False  # (Lightning's flag) set by the Tuner: its run ends once the search is done

    def setup(self, trainer, pl_module, stage=None):
        """Lightning's checks, before the run's set-up goes on: one process, loaders built by the module's or the
        DataModule's hooks (one per evaluation stage), and the attribute to tune."""
        from tasktrain.tuner.tuning import check_batch_size_setup

        check_batch_size_setup(trainer, pl_module, stage, self._batch_arg_name)

    def scale_batch_size(self, trainer, pl_module):
        """Run the search now (from any hook of the run); sets `optimal_batch_size` and the module's attribute."""
        from tasktrain.tuner.tuning import find_batch_size

        method = str(getattr(trainer.state.fn, "value", trainer.state.fn))
        loaders = {"method": method}
        if trainer.datamodule is not None:
            loaders["datamodule"] = trainer.datamodule
        self.optimal_batch_size = find_batch_size(
            trainer, pl_module, loaders, self._mode, self._steps_per_trial, self._init_val, self._max_trials,
            self._batch_arg_name, self._margin, self._max_val)
        if self._early_exit:
            from tasktrain.exceptions import _TunerExitException

            raise _TunerExitException()

    def on_fit_start(self, trainer, pl_module):
        self.scale_batch_size(trainer, pl_module)

    def on_validation_start(self, trainer, pl_module):
        if trainer.sanity_checking or trainer.state.fn != "validate":  # (a fit's validation: found at its start)
            return
        self.scale_batch_size(trainer, pl_module)

    def on_test_start(self, trainer, pl_module):
        self.scale_batch_size(trainer, pl_module)

    def on_predict_start(self, trainer, pl_module):
        self.scale_batch_size(trainer, pl_module)
