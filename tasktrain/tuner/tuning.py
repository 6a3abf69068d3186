"""Tuner: the learning-rate finder and the batch-size finder, each a few short fits on the trainer it is given.

    tuner = Tuner(trainer)
    finder = tuner.lr_find(module, train_loader)   # sweeps the rate, sets module.lr to finder.suggestion()
    size = tuner.scale_batch_size(module)          # grows module.batch_size while a few steps still fit
    trainer.fit(module, ...)                       # the real run, from the module's original weights

Both leave the module's weights and the trainer's settings and state (global_step, current_epoch) as they found
them (they run with the trainer's callbacks, loggers and profiler set aside: nothing is checkpointed, logged or
profiled), and change only the attribute they tune.
They run on one process: on several, each rank's trials would have to agree on every outcome (an out-of-memory
error on one rank leaves the others waiting); find the values in a one-process run and pass them in.
"""
import copy
import warnings

from tasktrain.tuner.batch_size_scaling import scale_batch_size
from tasktrain.tuner.lr_finder import lr_find


class Tuner:
    def __init__(self, trainer):
        self._trainer = trainer

    def lr_find(self, model, train_dataloaders=None, val_dataloaders=None, dataloaders=None, datamodule=None,
                method="fit", min_lr=1e-8, max_lr=1.0, num_training=100, mode="exponential",
                early_stop_threshold=4.0, update_attr=True, attr_name=""):
        """Train `num_training` steps with the rate growing from min_lr to max_lr ("exponential" or "linear"),
        recording the smoothed loss; stops early once the loss passes early_stop_threshold x its best (None: never).
        Returns an LRFinder (`results` {"lr": [...], "loss": [...]}, `suggestion()`); with update_attr, sets the
        module's `lr` / `learning_rate` attribute or hyper-parameter (or `attr_name`) to the suggestion."""
        _check_method(method)
        loaders = _fit_loaders(train_dataloaders, val_dataloaders, dataloaders, datamodule)
        if _skipped(self._trainer, "learning rate finder"):
            return None
        with _tuning(self._trainer, model, "lr_find"):
            return lr_find(self._trainer, model, loaders, min_lr, max_lr, num_training, mode, early_stop_threshold,
                           update_attr, attr_name)

    def scale_batch_size(self, model, train_dataloaders=None, val_dataloaders=None, dataloaders=None,
                         datamodule=None, method="fit", mode="power", steps_per_trial=3, init_val=2, max_trials=25,
                         batch_arg_name="batch_size"):
        """The largest batch size (module.<batch_arg_name>, or its hyper-parameter, read by the module's own
        train_dataloader) with which `steps_per_trial` training and validation steps run without running out of
        memory: doubled from init_val until a trial fails ("power"), then, in "binsearch", bisected between the
        last size that fit and the first that did not. Sets the attribute and returns the size."""
        _check_method(method)
        if train_dataloaders is not None or val_dataloaders is not None or dataloaders is not None:
            raise ValueError("scale_batch_size changes the module's batch size attribute, which its own "
                             "train_dataloader() must read: loaders passed in are already built with one size. Build "
                             "them in the module's (or the DataModule's) train_dataloader()/val_dataloader().")
        loaders = _fit_loaders(None, None, None, datamodule)
        if _skipped(self._trainer, "batch size scaler"):
            return None
        with _tuning(self._trainer, model, "scale_batch_size"):
            return scale_batch_size(self._trainer, model, loaders, mode, steps_per_trial, init_val, max_trials,
                                    batch_arg_name)


def _skipped(trainer, what):
    """Lightning's rule: a fast_dev_run trainer only checks that the code runs, so nothing is tuned (None)."""
    if trainer.fast_dev_run:
        warnings.warn(f"Skipping {what} since `fast_dev_run` is enabled.", UserWarning, stacklevel=3)
        return True
    return False


def _check_method(method):
    if method != "fit":
        raise ValueError(f"method={method!r}: the tuner tunes training (method='fit'); validate/test/predict have "
                         "no learning rate, and their batch size can be found with a fit's.")


def _fit_loaders(train, val, dataloaders, datamodule):
    if dataloaders is not None and train is not None:
        raise ValueError("Give train_dataloaders or dataloaders, not both.")
    kwargs = {"train_dataloaders": train if train is not None else dataloaders, "val_dataloaders": val}
    if datamodule is not None:
        kwargs = {"datamodule": datamodule}
    return kwargs


_SETTINGS = ("max_epochs", "max_steps", "limit_train_batches", "limit_val_batches", "val_check_interval",
             "check_val_every_n_epoch", "num_sanity_val_steps", "callbacks", "accumulate_grad_batches", "profiler",
             "state", "_max_epochs_unset", "_loggers")


class _tuning:
    """Set the trainer up for trials (no callbacks, loggers, profiler or sanity check) and put everything back
    after: its settings, where it is (global_step, current_epoch), and the module's weights and buffers."""

    def __init__(self, trainer, model, name):
        if trainer.world_size > 1:
            raise ValueError(f"Tuner.{name} runs on one process; this trainer has {trainer.world_size}. Find the "
                             "value in a one-process run (devices=1) and pass it to this one.")
        self.trainer, self.model = trainer, model

    def __enter__(self):
        self.settings = {name: getattr(self.trainer, name) for name in _SETTINGS}
        self.settings["callbacks"] = list(self.trainer.callbacks)
        self.settings["state"] = copy.deepcopy(self.trainer.state)
        self.cut_short = self.trainer._epoch_cut_short
        self.weights = copy.deepcopy(self.model.state_dict())
        self.trainer.callbacks = []
        self.trainer._loggers = []  # (loggers that are not callbacks too)
        self.trainer.profiler = None  # the trials' actions are not the run's: no report, no trace for them
        self.trainer.num_sanity_val_steps = 0
        return self

    def __exit__(self, *exc):
        for name, value in self.settings.items():
            setattr(self.trainer, name, value)
        self.model.load_state_dict(self.weights)
        self.trainer.should_stop = False
        self.trainer._epoch_cut_short = self.cut_short  # (the trials' last epoch is not the run's)
        return False
